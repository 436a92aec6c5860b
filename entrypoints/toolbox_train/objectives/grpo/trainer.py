"""GRPO on TRL's GRPOTrainer, with the Toolbox additions: each reward function guarded so that one
that raises is named, a NaN/inf/None reward stopping the run as a NaN loss does, and the static-cache
sampler's decoding compiled. The functions themselves are resolved and tried before the model loads
(planning/rewards.py); the sampler is picked there too (planning/generation.py)."""

from __future__ import annotations

import functools
import inspect

from toolbox_train.training import preference
from toolbox_train.objectives.grpo.config import grpo_args
from toolbox_train.planning.rewards import label as reward_label


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
            fn = reward_label(e.index, self.toolbox_run.cfg.grpo.rewards[e.index])
            raise self.stopped(f"{fn} raised {type(e.exc).__name__}: "
                               f"{first_line(e.exc, 200)} at step {step}", "fix the function, then resume") from None
        bad = ~torch.isfinite(rewards)
        if bad.any():
            entries = self.toolbox_run.cfg.grpo.rewards
            named = "; ".join(f"{reward_label(i, entries[i])}: {int(bad[:, i].sum())} of "
                              f"{len(bad)} completions" for i in bad.any(0).nonzero().flatten().tolist())
            raise self.stopped(f"a reward function returned NaN/inf or None at step {step} "
                               f"({named})", "every completion needs a finite number from every reward function")
        return rewards


class CompiledSampler:
    """grpo.generation transformers-static: TRL 1.15 builds its GenerationConfig with `disable_compile=True`
    (grpo_trainer.py), so its `cache_implementation="static"` alone decodes eagerly in a preallocated cache;
    the compiled decoding is what made the static cache 2.9x-4.5x faster (docs/preference.md). Turned back on
    here; transformers still compiles only on an accelerator. The compiled forward reads the parameters
    the optimizer updates in place, so each generation samples from the current policy."""

    def __init__(self, *args, **kw):
        super().__init__(*args, **kw)
        if self.args.cache_implementation == "static" and not self.use_vllm:
            self.generation_config.disable_compile = False


def build(p, dist, model, tok, peft_cfg, train_ds, eval_ds, callbacks, fmt=None, rewards=None):
    """`rewards`: (functions, weights) as planning.rewards.check resolved them."""
    from trl import GRPOTrainer

    from toolbox_train.planning import generation
    from toolbox_train.planning.run import log

    sampler, why = generation.pick(p.cfg, p.backend, p.gpu)
    log(f"grpo.generation: {p.cfg.grpo.generation} -> {sampler} ({why})")
    funcs, weights = rewards or (None, None)
    return preference.trainer(p, GRPOTrainer, grpo_args(p, dist, weights), model, tok, peft_cfg, train_ds, eval_ds,
                              callbacks, mixins=(FiniteRewards, CompiledSampler),
                              reward_funcs=[f if isinstance(f, str) else guarded(i, f)  # a reward model's folder: TRL loads it
                                            for i, f in enumerate(funcs or ())])
