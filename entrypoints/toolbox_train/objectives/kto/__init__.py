"""KTO (`objective: kto`): completions labelled desirable or not, against a reference model (TRL's
KTOTrainer)."""

from __future__ import annotations

from pydantic import Field

from toolbox_train.units.objective import Objective, Section, policy_reference


class KtoCfg(Section):
    beta: float = Field(0.1, gt=0)
    desirable_weight: float = Field(1.0, gt=0, description="weight of rows labelled true")
    undesirable_weight: float = Field(1.0, gt=0, description="weight of rows labelled false")


# KTO runs each row and a mismatched (KL) one, but TRL 1.15 scores the KL rows under no_grad
# (kto_trainer.py): only its own rows keep activations (rows 1)
UNIT = Objective("kto", "completions labelled desirable or undesirable, against a reference model",
                 section=KtoCfg, data_format="unpaired", reference=policy_reference,
                 metrics=("rewards/chosen", "rewards/rejected", "rewards/margins", "kl"))
