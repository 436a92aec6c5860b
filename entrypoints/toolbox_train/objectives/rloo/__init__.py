"""RLOO (`objective: rloo`): completions sampled per prompt and scored by rewards, as GRPO's; each
completion's advantage is its reward minus the mean of the other completions of its prompt (the
leave-one-out baseline), the loss a clipped ratio of whole-sequence probabilities (TRL's
RLOOTrainer). It shares GRPO's reward entries (planning/reward_config.py, planning/rewards.py,
training/rewards.py) and the sampler (the generation unit, generation/). TRL 1.15's RLOOTrainer takes
no tools or environments."""

from __future__ import annotations

from pydantic import Field, model_validator

from toolbox_train.generation import sampler
from toolbox_train.objectives.rloo import hooks
from toolbox_train.planning.reward_config import RewardCfg
from toolbox_train.units.objective import Objective, Section, policy_reference


class RlooCfg(Section, sampler.Sampling):
    num_generations: int = Field(2, ge=2, description="completions sampled per prompt (the group; TRL's default 2)")
    max_completion_length: int = Field(256, gt=0, description="tokens generated per completion")
    temperature: float = Field(1.0, gt=0)
    beta: float = Field(0.05, ge=0, description="KL weight (TRL's default 0.05: a penalty on the reward, the "
                        "sequence's summed log-ratio to the reference); > 0 needs the reference model")
    rewards: list[RewardCfg] = Field(default_factory=list, description="summed (with their weights) per completion")
    generation: sampler.Mode = sampler.mode_field()  # the generation unit's fields (generation/sampler.py)
    vllm_gpu_memory_utilization: float | None = sampler.memory_field()
    merge_lora: sampler.Merge = sampler.merge_field()
    # TRL 1.15's RLOOConfig, its names and defaults
    epsilon: float = Field(0.2, gt=0, lt=1, description="lower clipping bound of the sequence ratio: 1 - epsilon")
    epsilon_high: float | None = Field(None, gt=0, description="upper bound 1 + epsilon_high (default: epsilon)")
    num_iterations: int = Field(1, ge=1, description="optimization passes over each generated batch (mu)")
    normalize_advantages: bool = Field(False, description="advantages scaled to mean 0, std 1 per generation batch")
    mask_truncated_completions: bool = Field(False, description="completions cut at max_completion_length "
                                                                "are left out of the loss")
    steps_per_generation: int | None = Field(None, ge=1, description="optimizer micro-steps per generated batch; "
                                                                     "default: gradient accumulation")

    @model_validator(mode="after")
    def _fields(self):
        why = sampler.fields_problem(self)
        if why:
            raise ValueError(why)
        if self.epsilon_high is not None and self.epsilon_high < self.epsilon:
            raise ValueError(f"epsilon_high {self.epsilon_high} is below epsilon {self.epsilon}")
        return self


def _reference(cfg) -> str:
    return "none" if cfg.rloo.beta == 0 else policy_reference(cfg)


def _describe(s: dict) -> dict:
    s["rewards"] = "+".join(r["function"] or r["model"] if r["weight"] == 1 else
                            f"{r['weight']}*{r['function'] or r['model']}" for r in s["rewards"])
    return s


UNIT = Objective("rloo", "completions sampled per prompt and scored by rewards; leave-one-out advantages",
                 section=RlooCfg, data_format="prompt", reference=_reference, describe=_describe,
                 # TRL 1.15's names; kl only with beta > 0
                 metrics=("reward", "reward_std", "kl", "entropy", "frac_reward_zero_std", "rewards/*",
                          "completions/mean_length", "clip_ratio/*"),
                 resolve=hooks.resolve, memory=hooks.memory, prepare=hooks.prepare,
                 # its loss reads each prompt with its completion (max_seq_length bounds the prompt alone)
                 extra_tokens=lambda cfg: cfg.rloo.max_completion_length,
                 # TRL's trainer on the hf backend (Unsloth patches GRPO's, not this one)
                 unsloth=False, auto_backend=lambda cfg: "hf")
