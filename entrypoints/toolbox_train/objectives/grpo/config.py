"""GRPO's TRL config: the shared arguments plus the `grpo:` section (the group, generation length
and temperature, the KL weight, the reward weights, the sampler the run resolved, the loss variant and
its clipping)."""

from __future__ import annotations

from toolbox_train.generation import sampler
from toolbox_train.generation.trainer import TOKENS_COUNTED_BY_TRL, trl_kwargs
from toolbox_train.training.arguments import trl_config

# grpo: fields that are GRPOConfig's own, under the same names
VARIANTS = ("loss_type", "importance_sampling_level", "epsilon", "epsilon_high", "num_iterations", "scale_rewards",
            "mask_truncated_completions", "steps_per_generation", "max_tool_calling_iterations",
            *sampler.Sampling.model_fields)


def grpo_args(p, dist, reward_weights: list[float] | None = None):
    from trl import GRPOConfig

    g = p.cfg.grpo
    return trl_config(GRPOConfig, p, dist, num_generations=g.num_generations,
                      max_completion_length=g.max_completion_length, temperature=g.temperature, beta=g.beta,
                      reward_weights=reward_weights, shuffle_dataset=p.cfg.data.shuffle,
                      **{k: getattr(g, k) for k in VARIANTS}, **trl_kwargs(g, p.extras["sampler"]),
                      **TOKENS_COUNTED_BY_TRL)
