"""GRPO with LoRA generates on merged weights (issue 46; generation/sampler.py merge, generation/trainer.py
MergedLora): greedy completions equal to the unmerged sampler's before and after an optimizer step, the
base weights never written, the adapters on again after each generation; a whole run trains the same
adapter with the merge as without it; the plan counts the merged copies; and where no merge can run,
`merge_lora: true` is one line, exit 2."""

from __future__ import annotations

import pytest

from helpers import pref
from helpers.tiny import lora_trainers, write_train_config
from toolbox_train.commands import finetune

GRPO = {"objective": "grpo", "method": "lora", "train.per_device_batch_size": 4, "grpo.num_generations": 2,
        "grpo.max_completion_length": 8, "data.max_seq_length": 48, "train.max_steps": 1,
        "grpo.generation": "transformers", "grpo.rewards": [{"function": "length", "max_chars": 9}]}


def test_merged_greedy_completions_equal_the_unmerged_before_and_after_a_step(tmp_path, tiny_model):
    import torch
    from peft.tuners.lora import Linear as LoraLinear

    from toolbox_train.generation.trainer import MergedLora

    # B random too (PEFT's default B = 0 would make the adapter a no-op before the first step): lora_trainers
    model, tok, trainers = lora_trainers(tmp_path, tiny_model, GRPO, {m: {"grpo.merge_lora": m} for m in (True, False)})
    for merge, t in trainers.items():
        assert t.toolbox_run.extras["sampler_merged"] is merge
    assert isinstance(trainers[True], MergedLora) and not isinstance(trainers[False], MergedLora)
    ids = tok("w5 w9 w13 w20", add_special_tokens=False)["input_ids"]
    frozen = {n: w.detach().clone() for n, w in model.named_parameters() if "lora_" not in n}
    layers = [m for m in model.modules() if isinstance(m, LoraLinear)]

    def sample():
        model.train()  # as in training: TRL generates inside training_step
        return {m: t._generate_single_turn([ids, ids[:3]], None, {}, 1)[0] for m, t in trainers.items()}

    def adapter_effect():  # the adapters are on: the output differs from the base's
        x = torch.tensor([ids])
        with torch.no_grad():
            on = model(input_ids=x).logits
            with model.disable_adapter():
                off = model(input_ids=x).logits
        return (on - off).abs().max().item()

    before = sample()
    merged = trainers[True]._merged
    assert len(merged) == len(layers) > 0  # every adapted linear layer ran merged
    m, buf = merged[0]
    w = m.get_base_layer().weight
    assert torch.allclose(buf, w + m.get_delta_weight(m.active_adapters[0]), atol=0, rtol=0)
    assert adapter_effect() > 1e-3

    opt = torch.optim.AdamW([w for n, w in model.named_parameters() if "lora_" in n], lr=0.05)
    loss = model(input_ids=torch.tensor([ids]), labels=torch.tensor([ids])).loss
    loss.backward()
    opt.step()
    for t in trainers.values():
        t.state.global_step += 1  # what the Trainer does after an optimizer step
    after = sample()

    assert before[True] == before[False]
    assert after[True] == after[False]
    assert after[False] != before[False]  # the step changed what the policy samples
    for n, w in model.named_parameters():
        if "lora_" not in n:
            assert torch.equal(w, frozen[n]), n  # never written, bit for bit
    assert all(m.get_base_layer().weight is not b for m, b in merged)  # swapped back
    assert adapter_effect() > 1e-3


def test_a_run_trains_the_same_adapter_merged_or_not(tmp_path, tiny_model):
    from safetensors.torch import load_file

    prompts = pref.write(tmp_path / "g.jsonl", "prompt", 16)
    adapters = {}
    for merge in (True, False):
        out = tmp_path / f"out-{merge}"
        cfg = write_train_config(tmp_path / f"{merge}.yaml", tiny_model, prompts, out,
                                 **{**GRPO, "train.max_steps": 3, "train.learning_rate": 0.2, "grpo.merge_lora": merge})
        assert finetune.main(["--config", str(cfg)]) == 0
        adapters[merge] = load_file(str(next(out.rglob("adapter_model.safetensors"))))
    assert adapters[True].keys() == adapters[False].keys()
    changed = 0
    for k, v in adapters[True].items():
        assert (v == adapters[False][k]).all(), k
        changed += bool(v.abs().sum())
    # B moved off zero: the later steps generated with a non-zero adapter (at this learning rate far enough
    # to change what is sampled: a merge left at step 0's adapter trains another adapter, checked by hand)
    assert changed


def test_plan_counts_the_merged_weights(tmp_path, tiny_model, capsys):
    prompts = pref.write(tmp_path / "g.jsonl", "prompt", 8)
    cfg = write_train_config(tmp_path / "t.yaml", tiny_model, prompts, tmp_path / "out", **GRPO)
    assert finetune.main(["--config", str(cfg), "--plan", "--machine", "h200"]) == 0
    out = capsys.readouterr().out
    from safetensors import safe_open

    # every linear layer LoRA adapts (all-linear: the decoder's projections), counted off the saved weights, bf16
    with safe_open(str(next(tiny_model.glob("*.safetensors"))), "pt") as f:
        merged = sum(f.get_slice(k).get_shape()[0] * f.get_slice(k).get_shape()[1] for k in f.keys()
                     if k.endswith("_proj.weight")) * 2
    assert f"LoRA merged for generation ({merged / 2**30:.2f} GiB of merged weights)" in out, out


@pytest.mark.parametrize("over,why", [
    ({"method": "full"}, "method is not lora"),
    ({"grpo.generation": "vllm-colocate"}, "vLLM syncs merged weights itself"),
])
def test_merge_lora_true_where_it_cannot_run_is_one_line(tmp_path, tiny_model, capsys, over, why):
    prompts = pref.write(tmp_path / "g.jsonl", "prompt", 8)
    cfg = write_train_config(tmp_path / "t.yaml", tiny_model, prompts, tmp_path / "out",
                             **{**GRPO, "grpo.merge_lora": True, **over})
    assert finetune.main(["--config", str(cfg)]) == 2
    err = capsys.readouterr().err
    assert f"grpo.merge_lora: true cannot run here: {why}" in err and "Traceback" not in err, err
    assert not (tmp_path / "out").exists()
