"""RLOO's TRL config: the shared arguments plus the `rloo:` section (the group, generation length and
temperature, the KL weight, the reward weights, the sampler the run resolved, the clipping)."""

from __future__ import annotations

from toolbox_train.generation import sampler
from toolbox_train.generation.trainer import TOKENS_COUNTED_BY_TRL, trl_kwargs
from toolbox_train.training.arguments import trl_config

# rloo: fields that are RLOOConfig's own, under the same names
OWN = ("num_generations", "max_completion_length", "temperature", "beta", "epsilon", "epsilon_high", "num_iterations",
       "normalize_advantages", "mask_truncated_completions", "steps_per_generation", *sampler.Sampling.model_fields)


def rloo_args(p, dist, reward_weights: list[float] | None = None):
    from trl import RLOOConfig

    r = p.cfg.rloo
    return trl_config(RLOOConfig, p, dist, reward_weights=reward_weights, shuffle_dataset=p.cfg.data.shuffle,
                      **{k: getattr(r, k) for k in OWN}, **trl_kwargs(r, p.extras["sampler"]),
                      **TOKENS_COUNTED_BY_TRL)
