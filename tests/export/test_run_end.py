"""The end of a finetune run: a human summary on stdout (JSON with --json), per-step lines on
stderr, loss.png beside metrics.jsonl, and output.export run last."""

from __future__ import annotations

import json
import subprocess
import sys

from helpers.tiny import write_dataset, write_train_config


def _finetune(tmp_path, model, *extra, **over):
    data = write_dataset(tmp_path / "d.jsonl", "text", n=40)
    cfg = write_train_config(tmp_path / "train.yaml", model, data, tmp_path / "out",
                             **{"method": "lora", "data.eval_split": 0.2, "output.eval_steps": 2, **over})
    return subprocess.run([sys.executable, "-m", "toolbox_train.commands.finetune", "--config", str(cfg), *extra],
                          capture_output=True, text=True, timeout=600)


def test_human_summary_loss_png_and_export(tmp_path, tiny_model):
    r = _finetune(tmp_path, tiny_model, **{"output.export": ["merged"]})
    assert r.returncode == 0, r.stderr[-3000:]
    out = tmp_path / "out"
    s = json.loads((out / "summary.json").read_text())
    assert s["steps"] == 6 and s["tokens"] > 0 and s["wall_s"] > 0 and s["eval_loss"] is not None
    # stdout is the summary alone: no per-step dicts, no JSON
    assert r.stdout.startswith("finetune: done\n") and "{" not in r.stdout
    assert f"loss         {s['first_loss']:.4f} -> {s['last_loss']:.4f}" in r.stdout
    assert f"eval loss    {s['eval_loss']:.4f}" in r.stdout
    assert f"evaluate --run {out}" in r.stdout and "tokens/s" in r.stdout
    assert "finetune: step 6/6  loss" in r.stderr and "'loss':" not in r.stderr
    png = (out / "loss.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and s["loss_png"] == str(out / "loss.png")
    assert (out / "export" / "merged" / "model.safetensors").is_file()
    assert s["exports"][0]["out"] == str(out / "export" / "merged")
    assert f"export       {out / 'export' / 'merged'}" in r.stdout


def test_json_flag_and_bad_export_item(tmp_path, tiny_model):
    r = _finetune(tmp_path, tiny_model, "--json", **{"train.max_steps": 2})
    assert r.returncode == 0, r.stderr[-3000:]
    assert json.loads(r.stdout)["steps"] == 2 and len(r.stdout.strip().splitlines()) == 1
    r = _finetune(tmp_path / "bad", tiny_model, **{"output.export": ["gguf:q9"]})
    assert r.returncode == 2 and "output.export.0" in r.stderr and "unknown quant type 'q9'" in r.stderr
    assert not (tmp_path / "bad" / "out").exists()
