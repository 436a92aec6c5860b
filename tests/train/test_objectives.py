"""The preference objectives on CPU with tiny models (issue 24): each trains a few steps through
`finetune` and exports; DPO learns the toy preference, GRPO raises its reward, DPO's loss equals
TRL's DPOTrainer run directly, a stopped run of each resumes exactly, the plan counts the reference."""

from __future__ import annotations

import dataclasses
import json

import pytest
import yaml
from safetensors import safe_open

from helpers import pref
from helpers.tiny import train_config
from toolbox_train.export import model as export_model
from toolbox_train.commands import finetune

KIND = {"dpo": "preference", "orpo": "implicit", "kto": "unpaired", "grpo": "prompt"}


def _metrics(out):
    return [json.loads(ln) for ln in (out / "metrics.jsonl").read_text().splitlines()]


def _cfg(tmp_path, model, objective, method, chat=False, **over):
    data = pref.write(tmp_path / f"{objective}.jsonl", KIND[objective], n=64, chat=chat)
    base = {"objective": objective, "method": method, "train.max_steps": 10, "train.per_device_batch_size": 8,
            "train.learning_rate": 5e-3 if method == "lora" else 1e-3, "lora.r": 8, "lora.alpha": 16,
            "data.max_seq_length": 48}
    return train_config(model, data, tmp_path / "out", **{**base, **over})


def _exports(out):
    merged = export_model.run(["--run", str(out), "--to", "merged", "--out", str(out.parent / "merged")])
    with safe_open(str(out.parent / "merged" / "model.safetensors"), framework="pt") as f:
        assert f.keys() and not any("lora_" in k for k in f.keys())
    return merged


def test_dpo_lora_learns_the_preference_and_exports(tmp_path, tiny_model):
    s = finetune.run(_cfg(tmp_path, tiny_model, "dpo", "lora", **{"train.max_steps": 12}))
    out = tmp_path / "out"
    m = _metrics(out)
    assert [r["step"] for r in m] == list(range(1, 13))
    assert m[0]["rewards/accuracies"] == 0.0  # policy == reference at the start: no margin yet
    assert min(r["rewards/accuracies"] for r in m[-4:]) > 0.9
    assert m[-1]["rewards/margins"] > m[1]["rewards/margins"] > 0
    assert s["objective"]["rewards/accuracies"]["last"] > 0.9 and s["last_loss"] < s["first_loss"]
    resolved = yaml.safe_load((out / "config.resolved.yaml").read_text())
    assert resolved["objective"] == "dpo" and resolved["dpo"]["beta"] == 0.1
    assert not {"kto", "orpo", "grpo"} & set(resolved)
    assert resolved["_resolved"]["reference_model"] == "adapter" and resolved["_resolved"]["data_format"] == "preference"
    assert "dpo          rewards/accuracies 0 -> 1" in finetune.report.human(s)
    _exports(out)


def test_dpo_loss_equals_trl_dpotrainer_run_directly(tmp_path, tiny_model):
    """The config maps onto TRL: IPO's first loss is 1/(4 beta^2) (policy == reference), so beta
    and the loss type show at step 1; the next steps check the learning rate, batch and order."""
    import torch
    import transformers
    from datasets import load_dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import DPOConfig, DPOTrainer

    from toolbox_train.training import logprob

    over = {"train.max_steps": 3, "dpo.beta": 0.2, "dpo.loss_type": "ipo", "train.seed": 3}
    finetune.run(_cfg(tmp_path, tiny_model, "dpo", "full", **over))
    ours = [r["loss"] for r in _metrics(tmp_path / "out")]
    assert ours[0] == pytest.approx(1 / (4 * 0.2**2), rel=1e-5)

    logprob.install()  # TRL 1.15's DPOTrainer has no CPU path of its own (logprob.py)
    transformers.set_seed(3)
    ds = load_dataset("json", data_files=str(tmp_path / "dpo.jsonl"), split="train")
    args = DPOConfig(output_dir=str(tmp_path / "trl"), per_device_train_batch_size=8, max_steps=3,
                     learning_rate=1e-3, lr_scheduler_type="constant", warmup_steps=0, beta=0.2,
                     loss_type=["ipo"], max_length=48, seed=3, data_seed=3, use_cpu=True, report_to="none",
                     logging_steps=1, save_strategy="no", disable_tqdm=True, optim="adamw_torch", bf16=False)
    trl = DPOTrainer(model=AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32), args=args,
                     train_dataset=ds, processing_class=AutoTokenizer.from_pretrained(tiny_model))
    trl.train()
    direct = [h["loss"] for h in trl.state.log_history if "loss" in h]
    assert ours == pytest.approx(direct, rel=1e-5)
    assert len(set(ours)) == 3  # it trained: three different losses


@pytest.mark.parametrize("objective", ["dpo", "kto", "orpo", "grpo"])
def test_stopped_and_resumed_equals_uninterrupted(tmp_path, tiny_model, monkeypatch, objective):
    over = {"train.max_steps": 5, "output.save_steps": 2, "train.lr_scheduler": "cosine", "train.warmup_steps": 1}
    if objective == "grpo":  # sampling: the generator's state must come back too
        over.update({"grpo.num_generations": 4, "grpo.max_completion_length": 6,
                     "grpo.rewards": [{"function": "format", "pattern": "o"}, {"function": "length", "max_chars": 12}]})

    def run(name, **kw):
        cfg = _cfg(tmp_path, tiny_model, objective, "full", **over)
        cfg["output"]["dir"] = str(tmp_path / name)
        return finetune.run(cfg, **kw)

    run("ref")
    monkeypatch.setenv("TOOLBOX_STOP_AFTER_STEP", "2")
    assert run("cut")["steps"] == 2
    monkeypatch.delenv("TOOLBOX_STOP_AFTER_STEP")
    assert run("cut", resume=True)["steps"] == 5
    with safe_open(str(tmp_path / "ref" / "model.safetensors"), framework="pt") as a, \
            safe_open(str(tmp_path / "cut" / "model.safetensors"), framework="pt") as b:
        assert list(a.keys()) == list(b.keys())
        diff = max((a.get_tensor(k) - b.get_tensor(k)).abs().max().item() for k in a.keys())
    assert diff <= 1e-6, diff
    ref, cut = _metrics(tmp_path / "ref"), _metrics(tmp_path / "cut")
    assert [r["step"] for r in cut] == list(range(1, 6))
    for k in ("loss", "rewards/margins", "reward"):
        if k in ref[0]:
            assert [r[k] for r in cut] == pytest.approx([r[k] for r in ref], abs=1e-5)


def test_kto_full_trains_against_a_frozen_copy_and_exports(tmp_path, tiny_model):
    s = finetune.run(_cfg(tmp_path, tiny_model, "kto", "full", **{"kto.undesirable_weight": 1.5}))
    out = tmp_path / "out"
    m = _metrics(out)
    assert len(m) == 10 and m[-1]["rewards/margins"] > 0.1 and s["last_loss"] < s["first_loss"]
    # what docs/preference.md says KTO logs: TRL 1.15's KTOTrainer computes no rewards/accuracies
    assert all("rewards/accuracies" not in r for r in m) and {"rewards/chosen", "rewards/rejected", "kl"} <= m[-1].keys()
    resolved = yaml.safe_load((out / "config.resolved.yaml").read_text())
    assert resolved["kto"]["undesirable_weight"] == 1.5 and resolved["_resolved"]["reference_model"] == "copy"
    _exports(out)


def test_orpo_lora_on_conversations_with_an_implicit_prompt(tmp_path, tiny_model):
    s = finetune.run(_cfg(tmp_path, tiny_model, "orpo", "lora", chat=True))
    out = tmp_path / "out"
    m = _metrics(out)
    assert m[-1]["log_odds_ratio"] > m[0]["log_odds_ratio"] and s["last_loss"] < s["first_loss"]
    # ORPO's batch has no input_ids: its tokens are counted from both sides (transformers counted 0)
    assert 0 < m[0]["tokens"] < m[1]["tokens"] and all(x["tokens_per_s"] > 0 for x in m) and s["tokens"] > 0
    assert yaml.safe_load((out / "config.resolved.yaml").read_text())["_resolved"]["reference_model"] == "none"
    _exports(out)


def test_grpo_raises_the_mean_reward_of_a_reward_file_beside_the_config(tmp_path, tiny_model):
    """A toy reward (the share of spaces in the completion) from a module beside the config; the
    built-in length penalty rides along with weight 0 so the mean reward is the toy's alone."""
    (tmp_path / "toy_rewards.py").write_text(
        "def spaces(completions, **kw):\n    return [c.count(' ') / max(len(c), 1) for c in completions]\n")
    cfg = _cfg(tmp_path, tiny_model, "grpo", "full", **{
        "train.max_steps": 16, "train.per_device_batch_size": 16, "train.learning_rate": 2e-2,
        "grpo.num_generations": 4, "grpo.max_completion_length": 8,
        "grpo.rewards": [{"function": "toy_rewards:spaces"}, {"function": "length", "max_chars": 64, "weight": 0}]})
    path = tmp_path / "train.yaml"
    path.write_text(yaml.safe_dump(cfg))
    s = finetune.run(path)
    r = [row["reward"] for row in _metrics(tmp_path / "out")]
    assert len(r) == 16 and sum(r[-4:]) / 4 > 2 * sum(r[:4]) / 4, r
    assert s["objective"]["reward"]["last"] == r[-1]
    _exports(tmp_path / "out")


def test_the_plan_counts_the_reference_copy_of_full_fine_tuning(tmp_path, tiny_model, capsys):
    path = tmp_path / "t.yaml"
    for objective, method, shown in (("dpo", "full", True), ("dpo", "lora", False), ("orpo", "full", False)):
        path.write_text(yaml.safe_dump(_cfg(tmp_path, tiny_model, objective, method)))
        assert finetune.main(["--config", str(path), "--plan", "--device-memory", "1GiB"]) == 0
        out = capsys.readouterr().out
        assert ("+reference copy" in out and "with the frozen reference copy" in out) == shown, out
    assert not (tmp_path / "out").exists()


def test_builtin_rewards():
    from toolbox_train.planning.rewards import format_reward, length_penalty

    fmt = format_reward(r"^<answer>\d+</answer>$")
    assert fmt(["<answer>42</answer>", "42", [{"role": "assistant", "content": "<answer>7</answer>"}]]) == [1, 0, 1]
    assert length_penalty(10)(["short", "x" * 15, "x" * 30]) == [0.0, -0.5, -2.0]


def test_dpo_on_the_unsloth_path_uses_the_adapter_disabled_base(tmp_path, tiny_model, monkeypatch):
    """Unsloth returns the model already wrapped in its LoRA (no peft_config for TRL): DPOTrainer
    must then take the adapter-disabled base as reference, not load a copy. Unsloth itself needs a
    GPU, so a stand-in with its loader's names wraps the model with PEFT as Unsloth does."""
    import importlib.machinery
    import sys
    import types

    from peft import LoraConfig, PeftModel, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from toolbox_train.training import loading as models
    from toolbox_train.units import registry
    from toolbox_train.training.trainer import Metrics

    class Fast:
        @staticmethod
        def from_pretrained(model_name, **kw):
            return AutoModelForCausalLM.from_pretrained(model_name), AutoTokenizer.from_pretrained(model_name)

        @staticmethod
        def get_peft_model(model, r, lora_alpha, target_modules="all-linear", **kw):
            return get_peft_model(model, LoraConfig(r=r, lora_alpha=lora_alpha, target_modules=target_modules))

    mod = types.ModuleType("unsloth")
    mod.__spec__ = importlib.machinery.ModuleSpec("unsloth", None)
    mod.FastLanguageModel = mod.FastModel = Fast
    monkeypatch.setitem(sys.modules, "unsloth", mod)
    cfg = _cfg(tmp_path, tiny_model, "dpo", "lora", **{"train.max_steps": 2})
    p = dataclasses.replace(finetune.resolve(cfg), backend="unsloth")  # what it resolves to with unsloth on a GPU
    p, train, _ = finetune.preflight.validate(p)
    p.out.mkdir()
    model, tok, peft_cfg = models.load(p, finetune.Dist())
    assert peft_cfg is None and isinstance(model, PeftModel)
    summary: dict = {}
    tr = registry.build(p, finetune.Dist(), model, tok, None, train, None, [Metrics(p.out / "m.jsonl", summary)])
    assert tr.ref_model is None and type(tr).__name__ == "ToolboxDPOTrainer"
    tr.train()
    assert summary["steps"] == 2


@pytest.mark.slow
def test_dpo_under_ddp_two_cpu_ranks_ends_with_one_set_of_weights(tmp_path, tiny_model):
    """launch's DDP (gloo) around the DPO trainer: both ranks hold the same adapter, rank 0 logs."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    cfg = tmp_path / "dpo.yaml"
    cfg.write_text(yaml.safe_dump(_cfg(tmp_path, tiny_model, "dpo", "lora", **{
        "train.max_steps": 4, "train.per_device_batch_size": 4, "train.batch_size": 8})))
    env = {**os.environ, "PYTHONPATH": str(root / "entrypoints"), "OMP_NUM_THREADS": "1"}
    for k in ("WORLD_SIZE", "RANK", "LOCAL_RANK"):
        env.pop(k, None)
    r = subprocess.run([sys.executable, "-m", "toolbox_train.commands.launch", "--strategy", "ddp", "--nproc",
                        "2", "--cpu", "--", "finetune", "--config", str(cfg), "--json"],
                       capture_output=True, text=True, timeout=400, env=env)
    assert r.returncode == 0, r.stderr[-4000:]
    s = json.loads(r.stdout.strip().splitlines()[-1])
    assert len(s["rank_weight_sha256"]) == 2 and len(set(s["rank_weight_sha256"])) == 1
    assert [m["step"] for m in _metrics(tmp_path / "out")] == [1, 2, 3, 4]
    assert s["objective"]["rewards/accuracies"]["last"] > 0.5
