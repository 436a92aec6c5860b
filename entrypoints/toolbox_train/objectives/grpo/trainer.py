"""GRPO on TRL's GRPOTrainer, with the Toolbox additions: each reward function guarded so that one
that raises is named, a NaN/inf/None reward stopping the run as a NaN loss does, and the static-cache
sampler's decoding compiled (generation/trainer.py). The functions themselves are resolved and tried
once before the model loads (its prepare hook: `p.inputs`); the sampler was picked when the run was
resolved (`p.extras`)."""

from __future__ import annotations

import functools
import inspect

from toolbox_train.generation.trainer import CompiledSampler
from toolbox_train.objectives.grpo.config import grpo_args
from toolbox_train.objectives.grpo.hooks import REWARDS
from toolbox_train.planning.rewards import label as reward_label
from toolbox_train.training import preference


class RewardRaised(Exception):
    """A reward function raised during training: its index in grpo.rewards, and the exception."""

    def __init__(self, index: int, exc: Exception):
        super().__init__(index, exc)
        self.index, self.exc = index, exc


def guarded(index: int, fn):
    """`fn`, whose exceptions come out as RewardRaised naming its entry (TRL's own would not name it).
    Async functions are left as they are: TRL tells them apart by their type."""
    if inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(getattr(fn, "__call__", None)):
        return fn

    @functools.wraps(fn)
    def call(*args, **kw):
        try:
            return fn(*args, **kw)
        except Exception as exc:
            raise RewardRaised(index, exc) from exc

    return call


class FiniteRewards:
    """GRPO: a reward that is NaN/inf, or None (which TRL 1.15 turns into NaN and leaves out of the mean,
    so that a run whose reward function always fails trains on zero advantages and exits 0), stops the run
    as a NaN loss does, naming the function; so does a function that raises (guarded). The NaN check is on
    the rewards gathered from every rank, so every rank stops at the same step."""

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        import torch

        from toolbox_train.contract import first_line

        step = self.state.global_step + 1
        try:
            rewards = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        except RewardRaised as e:
            fn = reward_label(e.index, self.toolbox_run.cfg.grpo.rewards[e.index], REWARDS)
            raise self.stopped(f"{fn} raised {type(e.exc).__name__}: "
                               f"{first_line(e.exc, 200)} at step {step}", "fix the function, then resume") from None
        bad = ~torch.isfinite(rewards)
        if bad.any():
            entries = self.toolbox_run.cfg.grpo.rewards
            named = "; ".join(f"{reward_label(i, entries[i], REWARDS)}: {int(bad[:, i].sum())} of "
                              f"{len(bad)} completions" for i in bad.any(0).nonzero().flatten().tolist())
            raise self.stopped(f"a reward function returned NaN/inf or None at step {step} "
                               f"({named})", "every completion needs a finite number from every reward function")
        return rewards


def build(p, dist, model, tok, peft_cfg, train_ds, eval_ds, callbacks):
    """`p.inputs`: (functions, weights) as the unit's prepare hook resolved them."""
    from trl import GRPOTrainer

    funcs, weights = p.inputs or (None, None)
    return preference.trainer(p, GRPOTrainer, grpo_args(p, dist, weights), model, tok, peft_cfg, train_ds, eval_ds,
                              callbacks, mixins=(FiniteRewards, CompiledSampler),
                              reward_funcs=[f if isinstance(f, str) else guarded(i, f)  # a reward model's folder: TRL loads it
                                            for i, f in enumerate(funcs or ())])
