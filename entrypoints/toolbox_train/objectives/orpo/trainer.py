"""ORPO on TRL's ORPOTrainer (trl.experimental.orpo in TRL 1.15), with the Toolbox additions."""

from __future__ import annotations

from toolbox_train.training import preference
from toolbox_train.objectives.orpo.config import orpo_args


def build(p, dist, model, tok, peft_cfg, train_ds, eval_ds, callbacks):
    from trl.experimental.orpo import ORPOTrainer

    if "prompt" not in train_ds.column_names:
        # DPOTrainer and KTOTrainer take an implicit prompt out themselves; ORPOTrainer does not
        from trl.data_utils import extract_prompt

        train_ds = train_ds.map(extract_prompt)
        if eval_ds is not None:
            eval_ds = eval_ds.map(extract_prompt)
    return preference.trainer(p, ORPOTrainer, orpo_args(p, dist), model, tok, peft_cfg, train_ds, eval_ds,
                              callbacks)
