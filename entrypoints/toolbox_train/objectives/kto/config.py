"""KTO's TRL config: the shared arguments plus the `kto:` section (beta, the weights of desirable
and undesirable rows)."""

from __future__ import annotations

from toolbox_train.training.arguments import trl_config


def kto_args(p, dist):
    from trl import KTOConfig

    k = p.cfg.kto
    return trl_config(KTOConfig, p, dist, beta=k.beta, desirable_weight=k.desirable_weight,
                      undesirable_weight=k.undesirable_weight)
