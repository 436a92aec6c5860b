"""DPO's TRL config: the shared arguments plus the `dpo:` section (beta, the loss types and their
weights, label smoothing)."""

from __future__ import annotations

from toolbox_train.training.arguments import trl_config


def dpo_args(p, dist):
    from trl import DPOConfig

    d = p.cfg.dpo
    return trl_config(DPOConfig, p, dist, beta=d.beta,
                      loss_type=d.loss_type if isinstance(d.loss_type, list) else [d.loss_type],
                      loss_weights=d.loss_weights, label_smoothing=d.label_smoothing)
