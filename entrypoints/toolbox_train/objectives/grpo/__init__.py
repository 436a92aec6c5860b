"""GRPO (`objective: grpo`): completions sampled per prompt, scored by reward functions (or reward
models), the group's advantages trained on (TRL's GRPOTrainer). Its hooks (hooks.py): the sampler
picked once (the generation unit, generation/), its KV cache in the memory plan, the rewards resolved
and tried once before the model loads (planning/rewards.py)."""

from __future__ import annotations

import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from toolbox_train.generation import sampler
from toolbox_train.objectives.grpo import hooks
from toolbox_train.planning.reward_config import RewardCfg
from toolbox_train.units.objective import Objective, policy_reference

# TRL 1.15's GRPO loss types (GRPOConfig.loss_type; its default dapo)
GRPO_LOSSES = ("grpo", "dr_grpo", "dapo", "bnpo", "cispo", "sapo", "luspo", "vespo")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True, frozen=True)


class GrpoCfg(_Strict, sampler.Sampling):
    num_generations: int = Field(4, ge=2, description="completions sampled per prompt (the group)")
    max_completion_length: int = Field(128, gt=0, description="tokens generated per completion")
    temperature: float = Field(1.0, gt=0)
    beta: float = Field(0.0, ge=0, description="KL weight; > 0 needs the reference model")
    rewards: list[RewardCfg] = Field(default_factory=list, description="summed (with their weights) per completion")
    # Agents (TRL 1.15's GRPOTrainer `tools`, `environment_factory`; planning/tools.py checks them)
    tools: list[str] = Field(default_factory=list, description="module:function, each a tool the model may call "
                             "while it generates (typed arguments, a docstring with an Args: line for each)")
    environment: str | None = Field(None, description="module:Class, one instance per rollout: reset(**row), "
                                    "its public methods the model's tools, optionally get_reward()")
    max_tool_calling_iterations: int | None = Field(None, ge=1, description="tool-calling turns per completion "
                                                    "at most (TRL's name; default: until a turn calls no tool)")
    generation: sampler.Mode = sampler.mode_field()  # the generation unit's fields (generation/sampler.py)
    vllm_gpu_memory_utilization: float | None = sampler.memory_field()
    merge_lora: sampler.Merge = sampler.merge_field()
    # TRL 1.15's GRPOConfig, its names and defaults
    loss_type: Literal[GRPO_LOSSES] = Field("dapo", description="how token losses are aggregated")  # type: ignore[valid-type]
    importance_sampling_level: Literal["token", "sequence"] = Field(
        "token", description="sequence: one ratio per completion (GSPO)")
    epsilon: float = Field(0.2, gt=0, lt=1, description="lower clipping bound of the ratio: 1 - epsilon")
    epsilon_high: float | None = Field(None, gt=0, description="upper bound 1 + epsilon_high (clip-higher, DAPO: "
                                                               "0.28); cispo: the ratio's cap (ScaleRL: 5.0)")
    num_iterations: int = Field(1, ge=1, description="optimization passes over each generated batch (mu)")
    scale_rewards: Literal["group", "batch", "none"] = Field("group", description="the std rewards are divided by")
    mask_truncated_completions: bool = Field(False, description="completions cut at max_completion_length "
                                                                "are left out of the loss")
    steps_per_generation: int | None = Field(None, ge=1, description="optimizer micro-steps per generated batch; "
                                                                     "default: gradient accumulation")

    @model_validator(mode="after")
    def _combinations(self):
        why = sampler.fields_problem(self)
        if why:
            raise ValueError(why)
        for entry in (*self.tools, self.environment or "m:C"):
            if not re.fullmatch(r"[A-Za-z_][\w.]*:[A-Za-z_]\w*", entry):
                raise ValueError(f"{entry!r}: expected module:name (a module.py beside the config, or installed)")
        if self.max_tool_calling_iterations is not None and not (self.tools or self.environment):
            raise ValueError("max_tool_calling_iterations belongs to tools or an environment")
        lt, level, hi = self.loss_type, self.importance_sampling_level, self.epsilon_high
        if lt == "cispo":
            if hi is None or hi <= 1:
                raise ValueError(f"loss_type cispo caps the ratio at epsilon_high, which must be above 1 "
                                 f"(got {hi}; ScaleRL: 5.0)")
        elif hi is not None and hi < self.epsilon:
            raise ValueError(f"epsilon_high {hi} is below epsilon {self.epsilon} (clip-higher: epsilon_high >= epsilon)")
        # TRL 1.15 only warns about these; each trains something else than its name says
        if lt == "luspo" and level != "sequence":
            raise ValueError("loss_type luspo is sequence-level: set importance_sampling_level: sequence")
        if lt == "vespo" and level != "token":
            raise ValueError("loss_type vespo computes its sequence weights itself: importance_sampling_level: token")
        if level == "sequence" and lt in ("bnpo", "dr_grpo", "dapo", "cispo"):
            raise ValueError(f"importance_sampling_level sequence (GSPO) with loss_type {lt} weights each completion "
                             f"by its length; GSPO is loss_type grpo (or luspo)")
        return self


def _reference(cfg) -> str:
    return "none" if cfg.grpo.beta == 0 else policy_reference(cfg)


def _describe(s: dict) -> dict:
    for k in ("tools", "environment", "max_tool_calling_iterations"):
        if not s.get(k):
            s.pop(k, None)
    if s.get("tools"):
        s["tools"] = "+".join(s["tools"])
    s["rewards"] = "+".join(r["function"] or r["model"] if r["weight"] == 1 else
                            f"{r['weight']}*{r['function'] or r['model']}" for r in s["rewards"])
    return s


UNIT = Objective("grpo", "completions sampled per prompt and scored by rewards; the group's advantages",
                 section=GrpoCfg, data_format="prompt", reference=_reference, describe=_describe,
                 # TRL 1.15's names; kl only with beta > 0, tools/* only with tools (turns, calls, failures: trainer.py)
                 metrics=("reward", "reward_std", "kl", "entropy", "frac_reward_zero_std", "rewards/*", "tools/*",
                          "completions/mean_length", "clip_ratio/*"),
                 resolve=hooks.resolve, memory=hooks.memory, prepare=hooks.prepare,
                 # its loss reads each prompt with its completion (max_seq_length bounds the prompt alone)
                 extra_tokens=lambda cfg: cfg.grpo.max_completion_length,
                 # Measured (H100, llama-1b LoRA, docs/bench/2026-12-06-h100/grpo-unsloth-2/): Unsloth's own
                 # path 2.11 s a step at 3.4 GiB, hf's static sampler 2.23 s at 13.6 GiB (TRL's default on hf:
                 # 9.19 s, ../grpo-speed/): Unsloth where it runs; vllm-colocate is TRL's own mode, on hf; so
                 # are tools and environments (TRL's tool loop, tested on hf; not run under Unsloth's patched trainer)
                 auto_backend=lambda cfg: "hf" if (cfg.grpo.generation == "vllm-colocate" or cfg.grpo.tools
                                                   or cfg.grpo.environment) else None)
