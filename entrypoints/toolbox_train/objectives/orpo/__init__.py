"""ORPO (`objective: orpo`): SFT on chosen plus an odds-ratio term against rejected, no reference
model (TRL's ORPOTrainer, trl.experimental.orpo)."""

from __future__ import annotations

from pydantic import Field

from toolbox_train.units.objective import Objective, Section


class OrpoCfg(Section):
    beta: float = Field(0.1, gt=0, description="lambda of the ORPO paper: weight of the odds-ratio term")


# TRL's ORPOTrainer reads the model's logits of both sequences (Unsloth's forward does not build them)
UNIT = Objective("orpo", "chosen's likelihood up, its odds over rejected's, no reference model", section=OrpoCfg,
                 data_format="preference", rows=2, logits=True,
                 metrics=("rewards/accuracies", "rewards/margins", "rewards/chosen", "rewards/rejected", "log_odds_ratio"))
