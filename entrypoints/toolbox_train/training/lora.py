"""The PEFT LoRA config of a run (which modules get adapters), shared by the HF loader (models)
and the resume check (resume), which builds the same adapter on the meta device. It imports no
planning module: models imports planning.checks, and planning.checks calls resume."""

from __future__ import annotations

import re

from ..planning.arithmetic import LORA_ALL_LINEAR, expert_targets

# Parts of multimodal wrappers (Gemma 3, Llava, Qwen-VL, ...) that text fine-tuning leaves frozen.
VISION_PARTS = ("vision_tower", "multi_modal_projector", "vision_model", "visual")


def lora_targets(p):
    t = p.cfg.lora.target_modules
    if not p.multimodal:
        return t
    # Text-only fine-tuning of a multimodal wrapper: adapters on the language model only.
    names = "|".join(LORA_ALL_LINEAR) if t == "all-linear" else "|".join(re.escape(x) for x in t)
    return rf"^(?!.*({'|'.join(VISION_PARTS)})).*\.({names})$"


def lora_target_parameters(p) -> list[str]:
    """The fused expert parameters (GPT-OSS's mlp.experts.gate_up_proj/down_proj) the MLP names in
    lora.target_modules select: `target_modules` matches modules only, and these are 3-D nn.Parameters,
    so without them the HF path would leave the experts frozen where Unsloth's get_peft_model adapts them."""
    if p.multimodal:
        return []
    return expert_targets(getattr(p.model_config, "model_type", ""), p.cfg.lora.target_modules)


def peft_config(p):
    """`p`: the run's planning.checks.Plan."""
    from peft import LoraConfig

    c = p.cfg.lora
    experts = lora_target_parameters(p)
    return LoraConfig(r=c.r, lora_alpha=c.alpha, lora_dropout=c.dropout, target_modules=lora_targets(p),
                      bias="none", task_type="CAUSAL_LM", **({"target_parameters": experts} if experts else {}))
