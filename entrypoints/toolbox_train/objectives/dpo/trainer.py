"""DPO on TRL's DPOTrainer, with the Toolbox additions."""

from __future__ import annotations

from toolbox_train.training import preference
from toolbox_train.objectives.dpo.config import dpo_args


def build(p, dist, model, tok, peft_cfg, train_ds, eval_ds, callbacks):
    from trl import DPOTrainer

    return preference.trainer(p, DPOTrainer, dpo_args(p, dist), model, tok, peft_cfg, train_ds, eval_ds, callbacks)
