"""RLOO (`objective: rloo`, issue 46) as an objective unit on TRL 1.15's RLOOTrainer, sharing GRPO's
reward entries, reward loading and guard, and the sampler: a run trains and records its metrics (kl
with beta > 0) in summary.json; the loss TRL's own `_compute_loss` gives on a fixed batch equals
the one computed here from the model's log-probabilities by RLOO's formula (a clipped ratio of whole
sequences: -min(r A, clip(r, 1 - eps, 1 + eps_high) A), r = exp(sum log pi - sum log pi_old), the
mean over sequences); bad settings refused before the model loads."""

from __future__ import annotations

import json

import pytest
import yaml

from helpers import pref
from helpers.tiny import train_config
from test_objectives_data import _refused
from toolbox_train.commands import finetune

RLOO = {"objective": "rloo", "method": "full", "train.per_device_batch_size": 4, "rloo.num_generations": 2,
        "rloo.max_completion_length": 6, "data.max_seq_length": 48, "train.max_steps": 2,
        "rloo.rewards": [{"function": "length", "max_chars": 9}]}


def test_rloo_trains_with_the_shared_rewards_and_keeps_its_metrics(tmp_path, tiny_model, caplog):
    """A module:function reward (GRPO's loader, the data's answer column) and a built-in; beta 0.05
    (TRL's default): the reference model is the base with the adapter disabled, kl logged and kept."""
    rows = [{"prompt": r["prompt"], "answer": r["prompt"].split()[-1]} for r in pref.rows("prompt", 8)]
    data = tmp_path / "g.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "my_rewards.py").write_text(
        "def correct(prompts, completions, answer, **kw):\n    return [float(a in c) for c, a in zip(completions, answer)]\n")
    cfg = train_config(tiny_model, data, tmp_path / "out", **{
        **RLOO, "method": "lora", "rloo.rewards": [{"function": "my_rewards:correct"},
                                                   {"function": "length", "max_chars": 9, "weight": 0.5}]})
    (tmp_path / "t.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
    assert finetune.main(["--config", str(tmp_path / "t.yaml")]) == 0
    out = tmp_path / "out"
    metrics = [json.loads(ln) for ln in (out / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [1, 2] and all("kl" in m and "reward" in m for m in metrics)
    # the tokens TRL counts after generating (prompts and completions); transformers' own count of a prompt batch
    # finds no input_ids and warned at every step
    assert 0 < metrics[0]["tokens"] < metrics[1]["tokens"]
    assert not [r for r in caplog.records if "Tried to track the number of tokens" in r.getMessage()]
    s = json.loads((out / "summary.json").read_text())["objective"]
    assert s["name"] == "rloo" and {"kl", "reward", "reward_std", "rewards/correct/mean", "rewards/length/mean"} <= s.keys()
    resolved = yaml.safe_load((out / "config.resolved.yaml").read_text())
    assert resolved["rloo"]["beta"] == 0.05 and resolved["_resolved"]["reference_model"] == "adapter"


@pytest.mark.parametrize("over, said", [
    ({"rloo.num_generations": 3}, "rloo.num_generations: 3 completions per prompt must divide the global batch of "
                                  "completions (4: per_device_batch_size x accumulation x ranks)"),
    ({"rloo.rewards": []}, "rloo.rewards: the objective needs at least one reward function"),
    ({"rloo.tools": ["m:f"]}, "rloo.tools"),  # TRL 1.15's RLOOTrainer takes no tools
    ({"rloo.epsilon": 0.3, "rloo.epsilon_high": 0.1}, "epsilon_high 0.1 is below epsilon 0.3"),
    ({"rloo.rewards": [{"function": "nope:f"}]}, "rloo.rewards.0.function: no nope.py beside the config"),
], ids=["groups", "no-rewards", "tools", "epsilon", "missing-module"])
def test_bad_settings_are_refused_before_the_model(tmp_path, tiny_model, capsys, over, said):
    prompts = pref.write(tmp_path / "g.jsonl", "prompt", 8)
    _refused(capsys, tmp_path, tiny_model, prompts, [said], **{**RLOO, **over})


def test_the_loss_is_rloos_formula_on_a_fixed_batch(tmp_path, tiny_model):
    import torch

    from toolbox_train.planning import preflight
    from toolbox_train.planning.run import Dist, resolve
    from toolbox_train.training import loading
    from toolbox_train.units import registry

    data = pref.write(tmp_path / "g.jsonl", "prompt", 8)
    p = resolve(train_config(tiny_model, data, tmp_path / "out", **{**RLOO, "rloo.epsilon": 0.1,
                                                                    "rloo.epsilon_high": 0.3}), check_output=False)
    p, train_ds, _ = preflight.validate(p)
    model, tok, _ = loading.load(p, Dist())
    t = registry.build(p, Dist(), model, tok, None, train_ds, None, [])
    assert (t.epsilon_low, t.epsilon_high, t.beta, t.num_generations) == (0.1, 0.3, 0.05, 2)
    model = t.model.train()

    g = torch.Generator().manual_seed(0)
    vocab = model.config.vocab_size
    prompt_ids = torch.randint(4, vocab, (4, 5), generator=g)
    prompt_mask = torch.ones(4, 5, dtype=torch.long)
    prompt_mask[1, :2] = 0  # a left-padded prompt
    completion_ids = torch.randint(4, vocab, (4, 6), generator=g)
    completion_mask = torch.ones(4, 6, dtype=torch.long)
    completion_mask[2, 4:] = 0  # a short completion
    with torch.no_grad():
        ids = torch.cat([prompt_ids, completion_ids], 1)
        logits = model(input_ids=ids, attention_mask=torch.cat([prompt_mask, completion_mask], 1)).logits
        logits = logits[:, prompt_ids.size(1) - 1:-1].float()
        per_token = torch.log_softmax(logits, -1).gather(-1, completion_ids.unsqueeze(-1)).squeeze(-1)
        logp = (per_token * completion_mask).sum(1)
    # old sequence log-probabilities off the current ones, both ways past both bounds
    old = logp + torch.tensor([-0.5, 0.5, -0.05, 0.4])
    rewards = torch.tensor([1.0, 0.0, 0.25, 0.75])  # two groups of two
    baseline = torch.tensor([0.0, 1.0, 0.75, 0.25])  # the other completion of the group
    advantages = rewards - baseline
    batch = {"prompt_ids": prompt_ids, "prompt_mask": prompt_mask, "completion_ids": completion_ids,
             "completion_mask": completion_mask, "advantages": advantages, "old_logps": old}
    with torch.no_grad():
        ours = t._compute_loss(model, dict(batch))
    r = torch.exp(logp - old)
    want = -torch.min(r * advantages, torch.clamp(r, 1 - 0.1, 1 + 0.3) * advantages).mean()
    assert ours.item() != 0.0
    torch.testing.assert_close(ours, want, rtol=1e-5, atol=1e-6)
    # the clipping acted on this batch: the unclipped loss differs
    assert not torch.isclose(want, -(r * advantages).mean())
