"""GGUF export and evaluation against llama.cpp's own tools (built by the fixture from the pinned
sdist): Llama, Qwen 3 and Gemma 3 tiny models on real vocabularies, fine-tuned a few steps."""

from __future__ import annotations

import json
import os
import shutil
import stat

import pytest

import vocab
from exportkit import ARCH_VOCAB, CTX_LEN, heldout_text
from toolbox_train.export import evaluate, llamacpp, model as export

GGUF_ARCH = {"llama": "llama", "qwen3": "qwen3", "gemma3": "gemma3"}


@pytest.fixture(autouse=True)
def _no_repack(monkeypatch):
    # llama.cpp's CPU weight repacking (its own option, env LLAMA_ARG_REPACK) segfaults on the tiny
    # models' q8_0/q4_k tensors (16-row k/v projections) in the pinned build on this AVX-512/AMX CPU;
    # it only changes the weights' memory layout for speed, so the tests run without it.
    monkeypatch.setenv("LLAMA_ARG_REPACK", "0")


def _hf_ppl(run, text, ctx):
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(run)
    cfg = json.loads((run / "adapter_config.json").read_text())
    base = AutoModelForCausalLM.from_pretrained(cfg["base_model_name_or_path"], dtype=torch.float32)
    model = PeftModel.from_pretrained(base, str(run)).eval()
    ids = tok(text)["input_ids"]
    return evaluate.hf_perplexity(model, ids, ctx, tok.bos_token_id if evaluate.add_bos(tok) else None)


@pytest.mark.parametrize("arch", ["llama", "qwen3", "gemma3"])
def test_gguf_export_matches_hf_perplexity(arch, real_vocab_run, llama_tools, tmp_path, capsys):
    run = real_vocab_run(arch)
    out = tmp_path / "gguf"
    rc = export.main(["--run", str(run), "--to", "gguf", "--quant", "f16,q8_0,q4_k_m", "--ollama",
                      "--out", str(out), "--llama-cpp", str(llama_tools)])
    err = capsys.readouterr().err
    assert rc == 0, err
    for q in ("f16", "q8_0", "q4_k_m"):
        assert f"wrote model-{q}.gguf (" in err
    sizes = {q: (out / f"model-{q}.gguf").stat().st_size for q in ("f16", "q8_0", "q4_k_m")}
    assert sizes["f16"] > sizes["q8_0"] > sizes["q4_k_m"]
    assert (out / "Modelfile").read_text().splitlines()[-1] == "FROM ./model-q4_k_m.gguf"
    # README.md: the model card every export writes (issue 32)
    assert sorted(p.name for p in out.iterdir()) == ["Modelfile", "README.md", "export.json", "model-f16.gguf",
                                                     "model-q4_k_m.gguf", "model-q8_0.gguf"]
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]

    kv = vocab.read_kv(out / "model-f16.gguf")
    a = GGUF_ARCH[arch]
    assert kv["general.architecture"] == a
    assert kv[f"{a}.context_length"] == CTX_LEN
    assert kv["tokenizer.ggml.pre"] == ARCH_VOCAB[arch]
    assert kv["tokenizer.chat_template"] == (run / "chat_template.jinja").read_text()
    assert vocab.read_kv(out / "model-q8_0.gguf")["general.architecture"] == a

    text_file = tmp_path / "text.txt"
    text_file.write_text(heldout_text())
    ctx = 64
    hf = _hf_ppl(run, text_file.read_text(), ctx)
    tools = llamacpp.Tools(llama_tools)
    f16 = llamacpp.perplexity(tools, out / "model-f16.gguf", text_file, ctx)
    q8 = llamacpp.perplexity(tools, out / "model-q8_0.gguf", text_file, ctx)
    assert f16["chunks"] == hf["chunks"] and f16["scored_tokens"] == hf["scored_tokens"]  # the same tokens
    assert abs(f16["ppl"] / hf["ppl"] - 1) < 0.01, (f16, hf)
    assert abs(q8["ppl"] / hf["ppl"] - 1) < 0.03, (q8, hf)


def test_evaluate_both_backends_and_prompts(real_vocab_run, llama_tools, tmp_path, capsys):
    run = real_vocab_run("llama")
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("the cat sees\na dog likes\n")
    rc = evaluate.main(["--run", str(run), "--llama-cpp", str(llama_tools), "--prompts", str(prompts),
                        "--max-new-tokens", "4"])
    cap = capsys.readouterr()
    assert rc == 0, cap.err
    r = json.loads((run / "eval.json").read_text())
    assert r["runtime"] == "llama" and r["quant"] == "f16"
    # Six LoRA steps on these sentences: the held-out ones (same world) got likelier.
    assert r["finetuned"]["ppl"] < r["base"]["ppl"]
    assert r["difference"] == pytest.approx(r["finetuned"]["ppl"] - r["base"]["ppl"])
    assert [c["prompt"] for c in r["completions"]] == ["the cat sees", "a dog likes"]
    assert all(isinstance(c["base"], str) and isinstance(c["finetuned"], str) for c in r["completions"])
    assert "fine-tuned" in cap.out and "prompt: the cat sees" in cap.out

    rc = evaluate.main(["--run", str(run), "--runtime", "hf", "--out", str(tmp_path / "hf.json")])
    assert rc == 0
    h = json.loads((tmp_path / "hf.json").read_text())
    assert h["ctx"] == r["ctx"] and h["base"]["scored_tokens"] == r["base"]["scored_tokens"]
    for w in ("base", "finetuned"):
        assert abs(h[w]["ppl"] / r[w]["ppl"] - 1) < 0.01, (w, h[w], r[w])


def test_failed_quantize_leaves_nothing(real_vocab_run, llama_tools, tmp_path, capsys):
    broken = tmp_path / "tools"
    shutil.copytree(llama_tools, broken, symlinks=True, ignore=shutil.ignore_patterns("models"))
    q = broken / "bin" / "llama-quantize"
    q.write_text("#!/bin/sh\necho 'quantize: simulated failure' >&2\nexit 3\n")
    q.chmod(q.stat().st_mode | stat.S_IEXEC)
    out = tmp_path / "out" / "gguf"
    out.parent.mkdir()  # --out's folder must exist (a missing one is refused before any work)
    rc = export.main(["--run", str(real_vocab_run("llama")), "--to", "gguf", "--quant", "f16,q8_0",
                      "--out", str(out), "--llama-cpp", str(broken)])
    err = capsys.readouterr().err
    assert rc == 1 and "llama-quantize q8_0 failed (exit 3)" in err and "Traceback" not in err
    assert os.listdir(tmp_path / "out") == []  # no output, no temporary folder


def test_evaluate_refusals(real_vocab_run, llama_tools, tiny_model, tmp_path, capsys):
    run = real_vocab_run("qwen3")
    rc = evaluate.main(["--run", str(run), "--prompts", str(tmp_path / "none.txt"), "--llama-cpp", str(llama_tools)])
    assert rc == 2 and "--prompts" in capsys.readouterr().err
    rc = evaluate.main(["--run", str(run), "--quant", "q7", "--llama-cpp", str(llama_tools)])
    assert rc == 2 and "unknown quant type" in capsys.readouterr().err
    rc = evaluate.main(["--run", str(run), "--llama-cpp", str(tmp_path)])
    assert rc == 2 and "llama.cpp tools not found" in capsys.readouterr().err
