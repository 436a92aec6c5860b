"""The cpu image built in CI carries llama.cpp: inside it, a tiny model on a real vocabulary is
fine-tuned, exported to GGUF q8_0, evaluated with the llama.cpp backend, and answers llama-completion,
with the image's own tools (/opt/llama.cpp), none of the host's."""

from __future__ import annotations

import json
import shutil

import pytest

from helpers.enginekit import podman, toolbox

pytestmark = pytest.mark.slow


def test_finetune_export_evaluate_and_llama_cli_in_the_cpu_image(cpu_image, real_vocab_model, tmp_path):
    from helpers.tiny import write_dataset, write_train_config

    tag = cpu_image["tag"]
    labels = json.loads(podman("image", "inspect", "--format", "{{json .Labels}}", tag).stdout)
    assert labels["io.github.toolbox.llama_cpp.commit"] == "0c1e57098bba43ac29e6e3b677cdceebdd22334f"

    ws = tmp_path / "ws"
    shutil.copytree(real_vocab_model("llama"), ws / "model")
    write_dataset(ws / "data" / "train.jsonl", "text", n=48)
    write_train_config(ws / "train.yaml", "/workspace/model", "/workspace/data/train.jsonl", "/workspace/out",
                       **{"method": "lora", "lora.r": 4, "lora.alpha": 8, "train.learning_rate": 2e-2,
                          "train.max_steps": 6, "data.max_seq_length": 64, "data.eval_split": 0.25})
    (ws / "prompts.txt").write_text("the cat sees\n")
    # llama.cpp's CPU weight repacking segfaults on these tiny models' 16-row tensors (see test_gguf.py)
    env = {"LLAMA_ARG_REPACK": "0"}

    def run(*cmd: str):
        cp = toolbox("run", "--engine", "podman", "--image", tag, "--workspace", str(ws), "--hf-cache",
                     str(tmp_path / "hf"), "--env", "LLAMA_ARG_REPACK", "--", *cmd, env=env, timeout=900)
        assert cp.returncode == 0, f"{' '.join(cmd)}\n{cp.stdout[-4000:]}\n{cp.stderr[-4000:]}"
        return cp.stdout + cp.stderr

    out = run("finetune", "--config", "/workspace/train.yaml")
    assert "export-model --run /workspace/out" in out  # the summary's next step, run next

    out = run("export-model", "--run", "/workspace/out", "--to", "gguf", "--quant", "q8_0")
    assert "wrote model-q8_0.gguf (" in out
    ggufs = sorted(p.name for p in (ws / "out").rglob("*.gguf"))
    assert "model-q8_0.gguf" in ggufs, ggufs
    gguf = next((ws / "out").rglob("model-q8_0.gguf"))
    assert gguf.read_bytes()[:4] == b"GGUF"

    run("evaluate", "--run", "/workspace/out", "--quant", "q8_0", "--prompts", "/workspace/prompts.txt",
        "--max-new-tokens", "4")
    r = json.loads((ws / "out" / "eval.json").read_text())
    assert r["runtime"] == "llama" and r["quant"] == "q8_0"
    assert r["finetuned"]["ppl"] < r["base"]["ppl"], r  # six LoRA steps on sentences of the same world
    assert r["completions"][0]["prompt"] == "the cat sees"

    rel = gguf.relative_to(ws).as_posix()
    # llama-cli of this llama.cpp only chats; plain text generation is llama-completion's
    out = run("llama-completion", "-m", f"/workspace/{rel}", "-p", "the cat sees", "-n", "4", "--temp", "0",
              "-no-cnv")
    assert "the cat sees" in out
    # the vision runner beside llama-server, from the same pinned source (a vision export's GGUF + mmproj)
    assert "--mmproj" in run("llama-mtmd-cli", "--help")
