"""KTO on TRL's KTOTrainer, with the Toolbox additions."""

from __future__ import annotations

from toolbox_train.training import preference
from toolbox_train.objectives.kto.config import kto_args


def build(p, dist, model, tok, peft_cfg, train_ds, eval_ds, callbacks):
    from trl import KTOTrainer

    return preference.trainer(p, KTOTrainer, kto_args(p, dist), model, tok, peft_cfg, train_ds, eval_ds, callbacks)
