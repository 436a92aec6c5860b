"""Distillation's TRL config (DistillationConfig): the shared arguments plus the `distill:` section (the
divergence's beta, the temperature, the completion length, the sampler the run resolved); the teacher
loaded by TRL in the training precision."""

from __future__ import annotations

from toolbox_train.generation.trainer import TOKENS_COUNTED_BY_TRL, trl_kwargs
from toolbox_train.training.arguments import trl_config


def distill_args(p, dist):
    from trl import DistillationConfig

    d = p.cfg.distill
    dtype = {"bf16": "bfloat16", "fp16": "float16"}.get(p.precision, "float32")
    return trl_config(DistillationConfig, p, dist, beta=d.beta, temperature=d.temperature,
                      max_completion_length=d.max_completion_length, shuffle_dataset=p.cfg.data.shuffle,
                      teacher_model_init_kwargs={"dtype": dtype, "trust_remote_code": p.cfg.model.trust_remote_code},
                      **trl_kwargs(d, p.extras["sampler"]), **TOKENS_COUNTED_BY_TRL)
