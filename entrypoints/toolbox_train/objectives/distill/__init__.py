"""On-policy distillation (`objective: distill`): the student samples completions of each prompt and
learns the teacher's next-token distribution over them, a generalized Jensen-Shannon divergence (GKD;
TRL's DistillationTrainer). Its hooks (hooks.py): the teacher checked and counted in the memory plan,
its tokenizer checked against the student's before anything loads, the sampler picked once
(the generation unit, generation/)."""

from __future__ import annotations

from pydantic import Field, model_validator

from toolbox_train.generation import sampler
from toolbox_train.objectives.distill import hooks
from toolbox_train.units.objective import Objective, Section


class DistillCfg(Section):
    teacher: str | None = Field(None, description="the teacher: a model folder (absolute, or beside the config) "
                                "whose tokenizer is the student's")
    beta: float = Field(1.0, ge=0, le=1, description="the divergence: 0 forward KL, 0.5 JSD, 1 reverse KL "
                        "(TRL's default)")
    temperature: float = Field(1.0, gt=0, description="of the sampling and of both distributions in the loss")
    max_completion_length: int = Field(128, gt=0, description="tokens the student generates per prompt")
    generation: sampler.Mode = sampler.mode_field()  # the generation unit's fields (generation/sampler.py)
    vllm_gpu_memory_utilization: float | None = sampler.memory_field()
    merge_lora: sampler.Merge = sampler.merge_field()

    @model_validator(mode="after")
    def _fields(self):
        why = sampler.fields_problem(self)
        if why:
            raise ValueError(why)
        return self


UNIT = Objective("distill", "the teacher's next-token distribution on the student's own completions (GKD)",
                 section=DistillCfg, data_format="prompt", metrics=("entropy", "completions/mean_length"),
                 # the loss reads each prompt with its completion; TRL's trainer on the hf backend only
                 extra_tokens=lambda cfg: cfg.distill.max_completion_length, unsloth=False,
                 auto_backend=lambda cfg: "hf", resolve=hooks.resolve, memory=hooks.memory, prepare=hooks.prepare)
