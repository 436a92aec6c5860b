"""ORPO's TRL config (trl.experimental.orpo in TRL 1.15): the shared arguments plus the `orpo:`
section (beta, the weight of the odds-ratio term)."""

from __future__ import annotations

from toolbox_train.training.arguments import trl_config


def orpo_args(p, dist):
    from trl.experimental.orpo import ORPOConfig

    return trl_config(ORPOConfig, p, dist, beta=p.cfg.orpo.beta)
