"""finetune on CPU: each data format, each method that runs here, each architecture; outputs."""

from __future__ import annotations

import json

import pytest
import yaml
from safetensors import safe_open

from helpers.tiny import train_config, write_dataset
from toolbox_train.commands import finetune


def _metrics(out):
    return [json.loads(ln) for ln in (out / "metrics.jsonl").read_text().splitlines()]


def _run(tmp_path, model, fmt="text", **over):
    data = write_dataset(tmp_path / f"{fmt}.jsonl", fmt, n=48)
    out = tmp_path / "out"
    summary = finetune.run(train_config(model, data, out, **over))
    return out, summary


@pytest.mark.parametrize("fmt", ["text", "alpaca", "messages"])
def test_full_finetune_each_format_loss_falls(tmp_path, tiny_model, fmt):
    out, s = _run(tmp_path, tiny_model, fmt, **{"train.max_steps": 8, "data.max_seq_length": 128})
    m = _metrics(out)
    assert [r["step"] for r in m] == list(range(1, 9))
    for r in m:
        assert set(r) >= {"step", "loss", "lr", "tokens", "tokens_per_s", "peak_mem_gib"}
        assert r["tokens"] > 0 and r["tokens_per_s"] > 0 and r["peak_mem_gib"] > 0
    assert m[-1]["loss"] < m[0]["loss"] - 0.3
    assert s["steps"] == 8 and s["first_loss"] == m[0]["loss"] and s["last_loss"] == m[-1]["loss"]
    assert s["output_dir"] == str(out) and s["tokens_per_s"] > 0
    with safe_open(str(out / "model.safetensors"), framework="pt") as f:
        assert any("layers.1" in k for k in f.keys())
    assert (out / "tokenizer.json").exists() and (out / "chat_template.jinja").exists()
    resolved = yaml.safe_load((out / "config.resolved.yaml").read_text())
    assert resolved["_resolved"]["data_format"] == fmt and resolved["_resolved"]["backend"] == "hf"
    assert json.loads((out / "summary.json").read_text())["steps"] == 8


@pytest.mark.parametrize("arch", ["llama", "qwen3", "gemma3", "gemma3-mm", "gpt-oss"])
def test_lora_each_architecture(tmp_path, tiny_models, arch):
    out, s = _run(tmp_path, tiny_models(arch), "messages",
                  **{"method": "lora", "lora.r": 4, "lora.alpha": 8, "train.learning_rate": 2e-2,
                     "train.max_steps": 6, "output.save": "both"})
    assert s["last_loss"] < s["first_loss"]
    with safe_open(str(out / "adapter_model.safetensors"), framework="pt") as f:
        keys = list(f.keys())
    assert keys and all("lora_" in k for k in keys)
    if arch == "gemma3-mm":
        # Text-only tuning of the multimodal wrapper: adapters on the language model only.
        assert not any("vision" in k or "multi_modal_projector" in k for k in keys)
    with safe_open(str(out / "merged" / "model.safetensors"), framework="pt") as f:
        assert not any("lora_" in k for k in f.keys())
    assert json.loads((out / "adapter_config.json").read_text())["r"] == 4


def test_everything_truncated_away_is_reported(tmp_path, tiny_model):
    with pytest.raises(finetune.UserError, match="truncation at data.max_seq_length 8"):
        _run(tmp_path, tiny_model, "alpaca", **{"data.max_seq_length": 8})


def test_merged_lora_differs_from_base_and_reloads(tmp_path, tiny_model):
    import torch
    from transformers import AutoModelForCausalLM

    out, _ = _run(tmp_path, tiny_model, "text", **{"method": "lora", "lora.r": 4, "output.save": "merged",
                                                   "lora.target_modules": ["q_proj", "v_proj"]})
    assert not (out / "adapter_model.safetensors").exists()
    merged = AutoModelForCausalLM.from_pretrained(out)
    base = AutoModelForCausalLM.from_pretrained(tiny_model)
    q = "model.layers.0.self_attn.q_proj.weight"
    sd_m, sd_b = merged.state_dict(), base.state_dict()
    assert not torch.equal(sd_m[q], sd_b[q])
    k = "model.layers.0.self_attn.k_proj.weight"  # not a target: unchanged
    assert torch.equal(sd_m[k], sd_b[k])


def test_grad_accumulation_global_batch_and_tensorboard(tmp_path, tiny_model):
    out, s = _run(tmp_path, tiny_model, "text", **{"train.batch_size": 8, "train.per_device_batch_size": 2,
                                                   "train.max_steps": 3, "output.tensorboard": True,
                                                   "data.packing": True, "data.eval_split": 0.2,
                                                   "train.gradient_checkpointing": True})
    resolved = yaml.safe_load((out / "config.resolved.yaml").read_text())
    assert resolved["_resolved"]["gradient_accumulation_steps"] == 4
    assert s["steps"] == 3
    assert list((out / "tensorboard").rglob("events.out.tfevents.*"))


@pytest.mark.parametrize("method", ["qlora", "lora-8bit"])
def test_quantized_methods_refused_on_cpu(tmp_path, tiny_model, method, capsys):
    data = write_dataset(tmp_path / "d.jsonl")
    cfg = tmp_path / "t.yaml"
    cfg.write_text(yaml.safe_dump(train_config(tiny_model, data, tmp_path / "out", method=method)))
    assert finetune.main(["--config", str(cfg)]) == 2
    assert f"method: {method} needs bitsandbytes and a GPU" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_backend_auto_is_hf_here_and_unsloth_refused(tmp_path, tiny_model):
    data = write_dataset(tmp_path / "d.jsonl")
    p = finetune.resolve(train_config(tiny_model, data, tmp_path / "o", backend="auto"))
    assert p.backend == "hf" and p.precision == "fp32" and p.liger is False
    with pytest.raises(finetune.UserError, match="backend: unsloth needs the unsloth package and a GPU"):
        finetune.resolve(train_config(tiny_model, data, tmp_path / "o", backend="unsloth"))
    with pytest.raises(finetune.UserError, match="train.liger: true needs"):
        finetune.resolve(train_config(tiny_model, data, tmp_path / "o", **{"train.liger": True}))


def test_hub_id_from_the_offline_cache(tmp_path, tiny_model, monkeypatch):
    """A hub id resolves from the HF cache with the network off (the layout huggingface_hub writes)."""
    import shutil

    cache = tmp_path / "hf" / "hub"
    snap = cache / "models--tiny-org--tiny-llama" / "snapshots" / ("0" * 40)
    shutil.copytree(tiny_model, snap)
    (snap.parents[1] / "refs").mkdir()
    (snap.parents[1] / "refs" / "main").write_text("0" * 40)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    import huggingface_hub.constants as hc

    monkeypatch.setattr(hc, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(hc, "HF_HUB_OFFLINE", True)
    out, s = _run(tmp_path, "tiny-org/tiny-llama", "text", **{"train.max_steps": 2})
    assert s["steps"] == 2 and (out / "model.safetensors").exists()
    with pytest.raises(finetune.UserError, match="model.path: tiny-org/absent: cannot read the model's config"):
        finetune.resolve(train_config("tiny-org/absent", tmp_path / "text.jsonl", tmp_path / "o2"))


@pytest.mark.parametrize("arch", ["gemma3-mm", "gpt-oss"])
def test_full_finetune_multimodal_wrapper_and_moe(tmp_path, tiny_models, arch):
    import torch
    from safetensors.torch import load_file

    model = tiny_models(arch)
    out, s = _run(tmp_path, model, "text", **{"train.max_steps": 4})
    assert s["last_loss"] < s["first_loss"]
    before, after = load_file(str(model / "model.safetensors")), load_file(str(out / "model.safetensors"))
    changed = {k for k in before if not torch.equal(before[k], after[k])}
    assert any("layers.1" in k for k in changed)
    if arch == "gemma3-mm":  # text data: the vision tower is frozen, saved unchanged
        vision = [k for k in before if "vision_tower" in k]
        assert vision and not changed & set(vision)
