"""The reward model's TRL config (RewardConfig): the shared arguments plus the `reward:` section."""

from __future__ import annotations

from toolbox_train.training.arguments import trl_config


def reward_args(p, dist):
    from trl import RewardConfig

    return trl_config(RewardConfig, p, dist, center_rewards_coefficient=p.cfg.reward.center_rewards_coefficient)
