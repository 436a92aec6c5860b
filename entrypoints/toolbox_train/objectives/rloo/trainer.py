"""RLOO on TRL's RLOOTrainer, with the Toolbox additions GRPO has: each reward function guarded, a
NaN/inf/None reward stopping the run (training/rewards.py), the static-cache sampler's decoding
compiled (generation/trainer.py)."""

from __future__ import annotations

from toolbox_train.generation.trainer import mixins as sampler_mixins
from toolbox_train.objectives.rloo.config import rloo_args
from toolbox_train.training import preference
from toolbox_train.training.rewards import FiniteRewards, for_trl


def build(p, dist, model, tok, peft_cfg, train_ds, eval_ds, callbacks):
    """`p.inputs`: (functions, weights) as the unit's prepare hook resolved them."""
    from trl import RLOOTrainer

    funcs, weights = p.inputs or (None, None)
    return preference.trainer(p, RLOOTrainer, rloo_args(p, dist, weights), model, tok, peft_cfg, train_ds, eval_ds,
                              callbacks, mixins=(FiniteRewards, *sampler_mixins(p.extras)), reward_funcs=for_trl(funcs))
