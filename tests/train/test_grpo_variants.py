"""GRPO's loss variants (issue 41): TRL 1.15's loss_type, importance_sampling_level (GSPO), epsilon /
epsilon_high, num_iterations, scale_rewards, mask_truncated_completions and steps_per_generation.
Each is refused in one line (exit 2, nothing written) when its value or combination is bad; each
reaches GRPOConfig under its own name; and the loss the trainer finetune builds computes
(TRL's own `_compute_loss`) equals one computed here from the log-probabilities and advantages by
the formula TRL 1.15 documents for that variant, on one fixed batch."""

from __future__ import annotations

import math

import pytest
import yaml

from helpers import pref
from helpers.tiny import train_config
from test_objectives_data import _refused
from toolbox_train.commands import finetune

GRPO = {"objective": "grpo", "method": "full", "train.per_device_batch_size": 4, "grpo.num_generations": 2,
        "grpo.max_completion_length": 6, "data.max_seq_length": 48, "train.max_steps": 1,
        "grpo.rewards": [{"function": "length", "max_chars": 9}]}


@pytest.mark.parametrize("over, said", [
    ({"grpo.loss_type": "ppo"}, "grpo.loss_type"),
    ({"grpo.epsilon": 0.2, "grpo.epsilon_high": 0.1}, "epsilon_high 0.1 is below epsilon 0.2"),
    ({"grpo.epsilon": 1.5}, "grpo.epsilon"),
    ({"grpo.loss_type": "cispo"}, "loss_type cispo caps the ratio at epsilon_high, which must be above 1"),
    ({"grpo.loss_type": "luspo"}, "loss_type luspo is sequence-level"),
    ({"grpo.loss_type": "vespo", "grpo.importance_sampling_level": "sequence"}, "loss_type vespo"),
    ({"grpo.importance_sampling_level": "sequence"}, "GSPO is loss_type grpo"),
    ({"grpo.importance_sampling_level": "segment"}, "grpo.importance_sampling_level"),
    ({"grpo.scale_rewards": "std"}, "grpo.scale_rewards"),
    ({"grpo.num_iterations": 0}, "grpo.num_iterations"),
    ({"grpo.num_generations": 8, "grpo.steps_per_generation": 3},
     "grpo.num_generations: 8 completions per prompt must divide the global batch of completions "
     "(12: per_device_batch_size x grpo.steps_per_generation x ranks)"),
], ids=lambda v: "-".join(f"{k.split('.')[-1]}={x}" for k, x in v.items()) if isinstance(v, dict) else None)
def test_a_bad_variant_or_combination_is_refused_before_the_model(tmp_path, tiny_model, capsys, over, said):
    prompts = pref.write(tmp_path / "g.jsonl", "prompt", 8)
    _refused(capsys, tmp_path, tiny_model, prompts, [said], **{**GRPO, **over})


@pytest.fixture(scope="module")
def built(tmp_path_factory, tiny_models):
    """What finetune loads for a GRPO run (full fine-tuning: no adapter, so one model serves every trainer)."""
    from toolbox_train.planning import preflight
    from toolbox_train.planning.run import Dist, resolve
    from toolbox_train.training import loading

    tmp = tmp_path_factory.mktemp("grpo-variants")
    data = pref.write(tmp / "g.jsonl", "prompt", 8)

    def plan_of(**over):
        p = resolve(train_config(tiny_models("llama"), data, tmp / "out", **{**GRPO, **over}), check_output=False)
        p, train_ds, _ = preflight.validate(p)
        return p, train_ds

    p, *_ = plan_of()
    model, tok, _ = loading.load(p, Dist())
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    return plan_of, model, tok


def _trainer(built, **over):
    from toolbox_train.planning.run import Dist
    from toolbox_train.units import registry

    plan_of, model, tok = built
    p, train_ds = plan_of(**over)
    t = registry.build(p, Dist(), model, tok, None, train_ds, None, [])
    t.current_gradient_accumulation_steps = 1  # what Trainer's loop sets before each micro-step
    return t


def _batch(model):
    """4 completions (2 groups of 2), a left-padded prompt and a short completion among them; old
    log-probabilities off the current ones so that the ratios move both ways past the clipping bounds."""
    import torch

    g = torch.Generator().manual_seed(0)
    vocab = model.config.vocab_size
    prompt_ids = torch.randint(4, vocab, (4, 5), generator=g)
    prompt_mask = torch.ones(4, 5, dtype=torch.long)
    prompt_mask[1, :2] = 0
    completion_ids = torch.randint(4, vocab, (4, 6), generator=g)
    completion_mask = torch.ones(4, 6, dtype=torch.long)
    completion_mask[2, 4:] = 0
    advantages = torch.tensor([1.0, -1.0, 0.5, -0.7])
    logp = _logps(model, prompt_ids, prompt_mask, completion_ids, completion_mask).detach()
    old = logp + (torch.rand(logp.shape, generator=g) - 0.5) * 0.8
    return {"prompt_ids": prompt_ids, "prompt_mask": prompt_mask, "completion_ids": completion_ids,
            "completion_mask": completion_mask, "advantages": advantages, "old_per_token_logps": old,
            "num_items_in_batch": completion_mask.sum()}


def _logps(model, prompt_ids, prompt_mask, completion_ids, completion_mask):
    """log pi(completion token | what precedes it), from the model's full logits (temperature 1)."""
    import torch

    ids = torch.cat([prompt_ids, completion_ids], 1)
    logits = model(input_ids=ids, attention_mask=torch.cat([prompt_mask, completion_mask], 1)).logits
    logits = logits[:, prompt_ids.size(1) - 1:-1].float()
    return torch.log_softmax(logits, -1).gather(-1, completion_ids.unsqueeze(-1)).squeeze(-1)


def _reference(g, b, logp, steps_per_generation: int, max_completion_length: int):
    """TRL 1.15's documented GRPO loss for the section `g` (its docs' formulas; grpo_config.py)."""
    import torch

    m, a = b["completion_mask"].float(), b["advantages"].unsqueeze(1)
    log_ratio = logp - b["old_per_token_logps"]
    if g.importance_sampling_level == "sequence":  # GSPO: the mean log-ratio of each completion
        log_ratio_is = ((log_ratio * m).sum(-1) / m.sum(-1).clamp(min=1)).unsqueeze(1)
    else:
        log_ratio_is = log_ratio
    ratio = torch.exp(log_ratio_is)
    lo, hi = g.epsilon, g.epsilon if g.epsilon_high is None else g.epsilon_high
    lt = g.loss_type
    if lt == "cispo":  # clip the weight, not the objective; the weight carries no gradient
        per_token = -torch.clamp(ratio, max=hi).detach() * a * logp
    elif lt == "sapo":  # a sigmoid gate with temperatures 1.0 (A > 0) and 1.05 (A <= 0)
        tau = torch.where(a > 0, 1.0, 1.05)
        per_token = -torch.sigmoid(tau * (ratio - 1)) * 4 / tau * a
    elif lt == "vespo":  # phi(w) = e^l w^k e^(-l w), w the sequence ratio; (k, l) = (2, 3) for A >= 0, else (3, 2)
        log_w = ((torch.clamp(log_ratio, -20, 20) * m).sum(-1, keepdim=True)).clamp(math.log(1e-8), 20)
        k, lam = torch.where(a >= 0, 2.0, 3.0), torch.where(a >= 0, 3.0, 2.0)
        phi = torch.exp(lam + k * log_w - lam * torch.exp(log_w))
        per_token = -phi * a * logp
    else:
        per_token = -torch.min(ratio * a, torch.clamp(ratio, 1 - lo, 1 + hi) * a)
    per_token = per_token.expand_as(m) if per_token.size(1) == 1 else per_token
    if lt in ("grpo", "sapo"):
        return ((per_token * m).sum(-1) / m.sum(-1)).mean()
    if lt == "bnpo":
        return (per_token * m).sum() / m.sum()
    if lt == "dr_grpo":
        return (per_token * m).sum() / (m.size(0) * max_completion_length)
    if lt == "luspo":
        return (per_token * m).sum(-1).mean()
    # dapo, cispo, vespo: the active tokens of the whole generation batch, spread over its micro-steps
    return (per_token * m).sum() / (b["num_items_in_batch"] / steps_per_generation)


VARIANTS = {
    "default-dapo": {},
    "grpo": {"grpo.loss_type": "grpo"},
    "dr_grpo": {"grpo.loss_type": "dr_grpo"},
    "bnpo": {"grpo.loss_type": "bnpo"},
    "dapo-clip-higher": {"grpo.epsilon": 0.1, "grpo.epsilon_high": 0.28},
    "cispo": {"grpo.loss_type": "cispo", "grpo.epsilon_high": 1.2},
    "sapo": {"grpo.loss_type": "sapo"},
    "vespo": {"grpo.loss_type": "vespo"},
    "gspo": {"grpo.loss_type": "grpo", "grpo.importance_sampling_level": "sequence"},
    "luspo": {"grpo.loss_type": "luspo", "grpo.importance_sampling_level": "sequence"},
    "dapo-steps_per_generation-2": {"grpo.steps_per_generation": 2},
    "num_iterations-scale-mask": {"grpo.num_iterations": 2, "grpo.scale_rewards": "batch",
                                  "grpo.mask_truncated_completions": True},
}


@pytest.mark.parametrize("name", VARIANTS)
def test_the_loss_is_trls_documented_formula_for_each_variant(built, name):
    import torch

    from toolbox_train.objectives.grpo.config import VARIANTS as FIELDS

    t = _trainer(built, **VARIANTS[name])
    g = t.toolbox_run.cfg.grpo
    for f in FIELDS:  # the section reaches GRPOConfig under TRL's names
        assert getattr(t.args, f) == (getattr(g, f) if f != "steps_per_generation" or g.steps_per_generation
                                      else t.args.gradient_accumulation_steps), f
    assert (t.loss_type, t.importance_sampling_level, t.epsilon_low, t.epsilon_high, t.num_iterations) == (
        g.loss_type, g.importance_sampling_level, g.epsilon, g.epsilon_high or g.epsilon, g.num_iterations)
    model = t.model.train()
    b = _batch(model)
    with torch.no_grad():
        ours = t._compute_loss(model, dict(b))
        logp = _logps(model, b["prompt_ids"], b["prompt_mask"], b["completion_ids"], b["completion_mask"])
        want = _reference(g, b, logp, t.args.steps_per_generation, g.max_completion_length)
    assert ours.item() != 0.0
    torch.testing.assert_close(ours, want, rtol=1e-5, atol=1e-6)


def test_the_variants_are_recorded_and_truncated_completions_leave_the_loss(tmp_path, tiny_model):
    """mask_truncated_completions acts where TRL builds the batch: a tiny model never ends within 6 tokens,
    so every completion is truncated and the masked run has nothing to learn from (zero gradient)."""
    prompts = pref.write(tmp_path / "g.jsonl", "prompt", 8)
    norms = {}
    for mask in (False, True):
        out = tmp_path / f"out-{mask}"
        over = {**GRPO, "grpo.rewards": [{"function": "length", "max_chars": 2}], "grpo.mask_truncated_completions": mask, "grpo.loss_type": "grpo",
                "grpo.epsilon_high": 0.28, "grpo.scale_rewards": "none", "grpo.num_iterations": 1}
        finetune.run(train_config(tiny_model, prompts, out, **over))
        resolved = yaml.safe_load((out / "config.resolved.yaml").read_text())["grpo"]
        assert {k: resolved[k] for k in ("loss_type", "epsilon_high", "scale_rewards", "mask_truncated_completions",
                                         "importance_sampling_level", "epsilon", "num_iterations",
                                         "steps_per_generation", "generation")} == {
            "loss_type": "grpo", "epsilon_high": 0.28, "scale_rewards": "none", "mask_truncated_completions": mask,
            "importance_sampling_level": "token", "epsilon": 0.2, "num_iterations": 1, "steps_per_generation": None,
            "generation": "auto"}
        rows = [yaml.safe_load(ln) for ln in (out / "metrics.jsonl").read_text().splitlines()]
        norms[mask] = rows[-1]["grad_norm"]
    assert norms[True] == 0.0 and norms[False] > 0.0, norms
