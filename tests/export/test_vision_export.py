"""After a vision-language run (issue 40): the merged export is an image-text model with its processor that
answers an image prompt as the trained adapter does, and the GGUF export writes the language model plus
its vision projector with llama.cpp's own converter (`--mmproj`), the projector architectures taken from
the converter's own list. Tiny Gemma 3 / Qwen2.5-VL / Qwen3-VL models on real vocabularies (the converter
recognises only those), LoRA-trained a few steps on image rows."""

from __future__ import annotations

import json
import os
import sys

import pytest

import vocab
from toolbox_train.export import llamacpp, model as export

VOCAB = {"gemma3": "llama-bpe", "qwen2.5-vl": "qwen2", "qwen3-vl": "qwen2"}
ARCH = {"gemma3": "Gemma3ForConditionalGeneration", "qwen2.5-vl": "Qwen2_5_VLForConditionalGeneration",
        "qwen3-vl": "Qwen3VLForConditionalGeneration"}
TEXT_GGUF = {"gemma3": "gemma3", "qwen2.5-vl": "qwen2vl", "qwen3-vl": "qwen3vl"}
PROJECTOR = {"gemma3": "gemma3", "qwen2.5-vl": "qwen2.5vl_merger", "qwen3-vl": "qwen3vl_merger"}


@pytest.fixture(scope="module")
def vision_run(vocab_tokenizer, tmp_path_factory):
    cache = {}

    def get(family):
        if family not in cache:
            from helpers.tiny import train_config
            from helpers.tiny_vision import make_tiny_vlm, require_torchvision, write_image_dataset
            from toolbox_train.commands import finetune

            if family.startswith("qwen"):
                require_torchvision()
            d = tmp_path_factory.mktemp(f"vision-export-{family}")
            base = make_tiny_vlm(d / "base", family, tokenizer=vocab_tokenizer(VOCAB[family]), depth=3)
            data = write_image_dataset(d / "data" / "train.jsonl", n=12)
            finetune.run(train_config(base, data, d / "run", **{
                "method": "lora", "lora.r": 4, "lora.alpha": 8, "train.max_steps": 3, "train.learning_rate": 2e-2,
                "data.max_seq_length": 64}))
            cache[family] = (base, d / "run")
        return cache[family]

    return get


def _image_batch(proc, colour):
    from helpers.tiny_vision import image_rows, png_bytes

    import io

    from PIL import Image

    msgs = image_rows(1, embed=True)[0]["messages"][:1]
    text = proc.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
    return proc(text=[text], images=[[Image.open(io.BytesIO(png_bytes(colour))).convert("RGB")]], return_tensors="pt")


@pytest.mark.parametrize("family", list(ARCH))
def test_merged_export_is_the_trained_image_text_model(vision_run, tmp_path, family):
    import torch
    from peft import PeftModel
    from transformers import AutoModelForImageTextToText, AutoProcessor

    base, run = vision_run(family)
    result = export.export(export.Request(str(run), "merged", out=str(tmp_path / "merged"), dtype="fp32"))
    merged = tmp_path / "merged"
    assert any("image-text model" in n for n in result["notes"]), result["notes"]
    assert (merged / "processor_config.json").is_file()
    proc = AutoProcessor.from_pretrained(merged)  # the processor came along: no base folder needed
    model = AutoModelForImageTextToText.from_pretrained(merged, dtype=torch.float32).eval()
    assert type(model).__name__ == ARCH[family]
    trained = PeftModel.from_pretrained(
        AutoModelForImageTextToText.from_pretrained(base, dtype=torch.float32), str(run)).eval()
    red, blue = _image_batch(proc, "red"), _image_batch(proc, "blue")
    with torch.no_grad():
        got, want = model(**red).logits, trained(**red).logits
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)  # the adapter merged, the tower kept
        assert not torch.allclose(got, model(**blue).logits)  # the image reaches the answer
        out = model.generate(**red, max_new_tokens=4, do_sample=False)
    assert out.shape[1] == red["input_ids"].shape[1] + 4  # it answers an image prompt
    card = (merged / "README.md").read_text()
    assert "pipeline_tag: image-text-to-text" in card and "vision-language model" in card


@pytest.mark.parametrize("family", list(ARCH))
def test_gguf_export_writes_the_vision_projector(vision_run, llama_tools, tmp_path, family):
    _, run = vision_run(family)
    result = export.export(export.Request(str(run), "gguf", quant="f16,q8_0", out=str(tmp_path / "gguf"),
                                          llama_cpp=str(llama_tools)))
    out = tmp_path / "gguf"
    names = sorted(f["path"] for f in result["files"])
    assert {"model-f16.gguf", "model-q8_0.gguf", "mmproj-f16.gguf"} <= set(names), names
    assert any("mmproj-f16.gguf" in n and "--mmproj" in n for n in result["notes"]), result["notes"]
    text = vocab.read_kv(out / "model-f16.gguf")
    assert text["general.architecture"] == TEXT_GGUF[family]
    proj = vocab.read_kv(out / "mmproj-f16.gguf")
    assert proj["general.architecture"] == "clip" and proj["clip.has_vision_encoder"] is True
    assert proj.get("clip.vision.projector_type", proj.get("clip.projector_type")) == PROJECTOR[family], proj
    sys.path.insert(0, str(llama_tools / "gguf-py"))
    try:
        from gguf import GGUFReader

        tensors = [t.name for t in GGUFReader(out / "mmproj-f16.gguf").tensors]
    finally:
        sys.path.remove(str(llama_tools / "gguf-py"))
    assert any(t.startswith("v.blk.0.") for t in tensors), tensors  # the tower's block, not only a projector
    assert json.loads((out / "export.json").read_text())["files"] == result["files"]
    assert "mmproj-f16.gguf" in (out / "README.md").read_text()


def test_projector_architectures_are_the_converters_own_list(llama_tools):
    found = llamacpp.projector_architectures(llamacpp.Tools(llama_tools))
    assert set(ARCH.values()) <= found
    assert "LlamaForCausalLM" not in found and "Gemma3ForCausalLM" not in found  # text-only models


def _hf_answer_nll(model, proc, row):
    """One row's answer NLL computed here, apart from the collator: the answer's tokens are those the
    conversation adds after the generation prompt (each rendered and run through the processor)."""
    import io

    import torch
    from PIL import Image

    from helpers.tiny_vision import png_bytes

    images = [Image.open(io.BytesIO(png_bytes(row["colour"]))).convert("RGB")]
    prompt = proc.apply_chat_template(row["messages"][:1], add_generation_prompt=True, tokenize=False)
    full = proc.apply_chat_template(row["messages"], tokenize=False)
    p = proc(text=[prompt], images=[images], return_tensors="pt", add_special_tokens=False)
    f = proc(text=[full], images=[images], return_tensors="pt", add_special_tokens=False)
    start = p["input_ids"].shape[1]
    with torch.no_grad():
        lp = torch.log_softmax(model(**f).logits[0, :-1].float(), -1)
    ids = f["input_ids"][0]
    return -sum(lp[i - 1, ids[i]].item() for i in range(start, len(ids))), len(ids) - start


def test_evaluate_scores_held_out_image_rows(vision_run, tmp_path, capsys):
    import json as _json
    import math

    import torch
    from peft import PeftModel
    from transformers import AutoModelForImageTextToText, AutoProcessor

    from helpers.tiny_vision import COLOURS, image_rows
    from toolbox_train.export import evaluate

    base, run = vision_run("gemma3")
    rows = image_rows(3, embed=True, seed=7)
    held = tmp_path / "held.jsonl"
    held.write_text("".join(_json.dumps(r) + "\n" for r in rows))
    assert evaluate.main(["--run", str(run), "--data", str(held), "--out", str(tmp_path / "eval.json")]) == 0
    result = _json.loads((tmp_path / "eval.json").read_text())
    assert result["runtime"] == "hf" and result["base"]["rows"] == 3
    proc = AutoProcessor.from_pretrained(run)
    models = {"base": AutoModelForImageTextToText.from_pretrained(base, dtype=torch.float32).eval()}
    models["finetuned"] = PeftModel.from_pretrained(
        AutoModelForImageTextToText.from_pretrained(base, dtype=torch.float32), str(run)).eval()
    for which, model in models.items():
        nll = count = 0
        for r in rows:
            colour = next(c for c in COLOURS if r["messages"][1]["content"][0]["text"].startswith(c))
            a, n = _hf_answer_nll(model, proc, {**r, "colour": colour})
            nll, count = nll + a, count + n
        assert result[which]["scored_tokens"] == count
        assert math.isclose(result[which]["ppl"], math.exp(nll / count), rel_tol=1e-4), (which, result[which])
    assert "answer perplexity on image rows" in capsys.readouterr().out


def test_evaluate_refuses_llama_runtime_for_a_vision_run(vision_run, tmp_path, capsys):
    from toolbox_train.export import evaluate

    _, run = vision_run("gemma3")
    capsys.readouterr()  # the session fixture's training output, when this test is the first to ask for it
    assert evaluate.main(["--run", str(run), "--runtime", "llama", "--data", str(tmp_path / "x.jsonl")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--runtime llama: llama-perplexity scores text only" in err[0], err
    assert not (run / "eval.json").exists() and not (run / "eval").exists()


@pytest.mark.parametrize("family", list(ARCH))
def test_llama_cpp_answers_an_image_prompt_with_the_exported_pair(vision_run, llama_tools, tmp_path, family):
    """The model GGUF and its projector run in llama.cpp's own multimodal CLI: the image encoded, tokens
    generated (the tiny model's words mean nothing; that it runs is the point)."""
    import subprocess

    from helpers.tiny_vision import png_bytes

    _, run = vision_run(family)
    export.export(export.Request(str(run), "gguf", out=str(tmp_path / "gguf"), llama_cpp=str(llama_tools)))
    (tmp_path / "red.png").write_bytes(png_bytes("red"))
    g = tmp_path / "gguf"
    r = subprocess.run([llama_tools / "bin" / "llama-mtmd-cli", "-m", g / "model-f16.gguf", "--mmproj",
                        g / "mmproj-f16.gguf", "--image", tmp_path / "red.png", "-p", "what colour?", "-n", "4",
                        "--temp", "0", "--no-warmup", "-t", "2"], capture_output=True, text=True, timeout=300,
                       env={**os.environ, "LLAMA_ARG_REPACK": "0"})  # test_gguf.py: repacking segfaults on tiny tensors
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    assert "image decoded" in r.stderr or "encoding image" in r.stderr or "mtmd batch encoding done" in r.stderr, \
        r.stderr[-3000:]
    assert r.stdout.strip(), r.stderr[-2000:]  # it generated
