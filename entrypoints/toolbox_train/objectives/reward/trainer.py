"""The reward model on TRL's RewardTrainer, with the Toolbox additions. The model is loaded as a
sequence classifier with one label (training/loading.py, from the unit's `head`)."""

from __future__ import annotations

from toolbox_train.objectives.reward.config import reward_args
from toolbox_train.training import preference


def build(p, dist, model, tok, peft_cfg, train_ds, eval_ds, callbacks):
    from trl import RewardTrainer

    return preference.trainer(p, RewardTrainer, reward_args(p, dist), model, tok, peft_cfg, train_ds, eval_ds,
                              callbacks)
