"""GRPO's TRL config: the shared arguments plus the `grpo:` section (the group, generation length
and temperature, the KL weight, the reward weights, the generation mode)."""

from __future__ import annotations

from toolbox_train.objectives.preference import trl_config
from toolbox_train.planning import generation


def grpo_args(p, dist, reward_weights: list[float] | None = None):
    from trl import GRPOConfig

    g = p.cfg.grpo
    return trl_config(GRPOConfig, p, dist, num_generations=g.num_generations,
                      max_completion_length=g.max_completion_length, temperature=g.temperature, beta=g.beta,
                      reward_weights=reward_weights, shuffle_dataset=p.cfg.data.shuffle, **generation.trl_kwargs(g))
