"""Reward model (`objective: reward`): a score per sequence, chosen's above rejected's (TRL's
RewardTrainer); the run folder is a sequence-classification model (one label) that GRPO takes as a
reward (`grpo.rewards: [{model: RUN_FOLDER}]`)."""

from __future__ import annotations

from pydantic import Field

from toolbox_train.units.objective import Objective, Section


class RewardModelCfg(Section):
    center_rewards_coefficient: float | None = Field(
        None, ge=0, description="weight of the mean squared reward added to the loss (keeps the scores near 0)")


UNIT = Objective("reward", "a score per sequence: -log sigmoid(chosen's score - rejected's)",
                 section=RewardModelCfg, data_format="preference", rows=2, head="sequence-classification",
                 unsloth=False, auto_backend=lambda cfg: "hf",
                 metrics=("accuracy", "margin", "mean_reward"))
