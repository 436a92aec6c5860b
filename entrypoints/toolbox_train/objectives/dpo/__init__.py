"""DPO (`objective: dpo`): chosen over rejected against a reference model (TRL's DPOTrainer)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from toolbox_train.units.objective import Objective, Section, policy_reference

# TRL 1.15's DPO loss types (DPOConfig.loss_type); several may be combined with loss_weights.
DPO_LOSSES = ("sigmoid", "hinge", "ipo", "exo_pair", "nca_pair", "robust", "bco_pair", "sppo_hard", "aot",
              "aot_unpaired", "apo_zero", "apo_down", "discopop", "sft")


class DpoCfg(Section):
    beta: float = Field(0.1, gt=0, description="strength of the pull towards the reference model")
    loss_type: Literal[DPO_LOSSES] | list[Literal[DPO_LOSSES]] = "sigmoid"  # type: ignore[valid-type]
    loss_weights: list[float] | None = Field(None, description="one weight per loss_type when there are several")
    label_smoothing: float = Field(0.0, ge=0.0, le=0.5, description="cDPO / robust: assumed label noise")

    @model_validator(mode="after")
    def _weights(self):
        n = len(self.loss_type) if isinstance(self.loss_type, list) else 1
        if self.loss_weights is not None and len(self.loss_weights) != n:
            raise ValueError(f"loss_weights has {len(self.loss_weights)} values for {n} loss_type(s)")
        return self


# Measured (issue 24, H200, llama-1b shape, TRL 1.15): DPOTrainer + PEFT 13.1 pairs/s, the same under
# Unsloth 2026.10.9 8.9 pairs/s: backend auto takes the faster path.
UNIT = Objective("dpo", "chosen over rejected, against a reference model", section=DpoCfg,
                 data_format="preference", reference=policy_reference, rows=2, auto_backend=lambda cfg: "hf",
                 metrics=("rewards/accuracies", "rewards/margins", "rewards/chosen", "rewards/rejected"))
