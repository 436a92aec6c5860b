"""The reward functions in training, for the objectives whose TRL trainer scores completions with them
(planning/rewards.py resolved and tried them before the model loaded; the entries are the objective's
section's `rewards`): each function guarded so that one that raises is named, and a NaN/inf/None reward
stopping the run as a NaN loss does (FiniteRewards, a mixin of the trainer class)."""

from __future__ import annotations

import functools
import inspect

from toolbox_train.planning.rewards import label


class RewardRaised(Exception):
    """A reward function raised during training: its index in the section's rewards, and the exception."""

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


def for_trl(funcs) -> list:
    """The trainer's `reward_funcs`: each function guarded, a reward model's folder as it is (TRL loads it)."""
    return [f if isinstance(f, str) else guarded(i, f) for i, f in enumerate(funcs or ())]


class FiniteRewards:
    """A reward that is NaN/inf, or None (which TRL 1.15 turns into NaN and leaves out of the mean, so
    that a run whose reward function always fails trains on zero advantages and exits 0), stops the run
    as a NaN loss does, naming the function; so does a function that raises (guarded). The NaN check is on
    the rewards gathered from every rank, so every rank stops at the same step."""

    def reward_named(self, i: int) -> str:
        """Reward column i as messages name it: the section's entry, or (after them) an environment's."""
        name = self.toolbox_run.objective.name
        section = getattr(self.toolbox_run.cfg, name)
        if i < len(section.rewards):
            return label(i, section.rewards[i], f"{name}.rewards")
        return f"{name}.environment {getattr(section, 'environment', None)}'s get_reward"  # TRL's column after them

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        import torch

        from toolbox_train.contract import first_line

        step = self.state.global_step + 1
        try:
            rewards = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        except RewardRaised as e:
            raise self.stopped(f"{self.reward_named(e.index)} raised {type(e.exc).__name__}: "
                               f"{first_line(e.exc, 200)} at step {step}", "fix the function, then resume") from None
        bad = ~torch.isfinite(rewards)
        if bad.any():
            named = "; ".join(f"{self.reward_named(i)}: {int(bad[:, i].sum())} of {len(bad)} completions"
                              for i in bad.any(0).nonzero().flatten().tolist())
            raise self.stopped(f"a reward function returned NaN/inf or None at step {step} "
                               f"({named})", "every completion needs a finite number from every reward function")
        return rewards
