"""The PEFT LoRA config of a run (which modules get adapters), shared by the HF loader
(training/loading.py) and the resume check (runs/resume.py); the adapter built on the meta device
(its shapes, for resume and the memory plan); the checks' part on adapters (check_adapter, called by
planning/run.py: target_modules entries that match nothing, MoE experts)."""

from __future__ import annotations

import math

from toolbox_train.contract import UserError
from toolbox_train.data.images import FORMAT as IMAGE_ROWS
from toolbox_train.units.objective import HEADS
from toolbox_train.models import vision
from toolbox_train.models.arithmetic import expert_targets, moe_experts


def lora_targets(p, model=None):
    """PEFT's target_modules. A vision-language model's: the full paths of the Linear modules of the parts
    vision.train names (models/vision.py: by module path and kind; default the language model only, as for text
    rows, which never reach the vision tower), read off `model` or the run's model built on the meta device (the
    same class and paths as the one the loader gives)."""
    t = p.cfg.lora.target_modules
    if not p.multimodal:
        return t
    # none: named modules of no part that trains (PEFT's NoMatchingPeftModuleError, which check_adapter turns into
    # one line naming them), or [projector] alone (preflight refuses it)
    return vision.lora_target_names(model if model is not None else meta_model(p), p.cfg.vision.train, t)


def lora_target_parameters(p) -> list[str]:
    """The fused expert parameters (GPT-OSS's mlp.experts.gate_up_proj/down_proj) the MLP names in
    lora.target_modules select: `target_modules` matches modules only, and these are 3-D nn.Parameters,
    so without them the HF path would leave the experts frozen where Unsloth's get_peft_model adapts them."""
    if p.multimodal:
        return []
    return expert_targets(getattr(p.model_config, "model_type", ""), p.cfg.lora.target_modules)


def peft_config(p, model=None):
    """`p`: the run (planning.run.ResolvedRun); `model`: the model it adapts, or its meta-device twin (a
    vision-language model's targets are read off it; built here where not given)."""
    from peft import LoraConfig

    c = p.cfg.lora
    experts = lora_target_parameters(p)
    whole = list(vision.projector_modules()) if p.multimodal and "projector" in p.cfg.vision.train else None
    return LoraConfig(r=c.r, lora_alpha=c.alpha, lora_dropout=c.dropout, target_modules=lora_targets(p, model),
                      bias="none", task_type=HEADS[head(p)][1], modules_to_save=whole,
                      **({"target_parameters": experts} if experts else {}))


def head(p, image_rows: bool = False) -> str:
    """The model class of the run (HEADS): the objective's (objectives/<name>/); a causal LM on image rows is
    the image-text-to-text model with its processor, as is a vision-language model with no causal-LM class
    (Qwen-VL) on text rows."""
    if p.objective.head != "causal-lm" or not p.multimodal:
        return p.objective.head
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    text_class = getattr(p.model_config, "model_type", "") in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
    return "image-text-to-text" if image_rows or not text_class else "causal-lm"


def meta_model(p):
    """The run's model, built from its config on the meta device (no memory, no weights read)."""
    import torch
    import transformers

    # the objective's model class (a score head's labels do not matter here); image rows: the one load_vision uses
    auto = HEADS[head(p, image_rows=getattr(p, "data_format", None) == IMAGE_ROWS)][0]
    with torch.device("meta"):
        return getattr(transformers, auto).from_config(p.model_config, trust_remote_code=p.cfg.model.trust_remote_code)


def adapter_shapes(p, built=None) -> dict[str, list[int]]:
    """Name -> shape of the PEFT adapter this run trains and saves, built on the meta device (or `built`)."""
    from peft import get_peft_model, get_peft_model_state_dict

    if built is None:
        model = meta_model(p)
        built = get_peft_model(model, peft_config(p, model))
    sd = get_peft_model_state_dict(built)
    return {k: list(v.shape) for k, v in sd.items()}


def module_names(model, multimodal: bool) -> list[str]:
    """The names lora.target_modules can take on `model` (its Linear, Embedding and Conv1D modules), in
    model order; a multimodal wrapper's vision parts left out (text fine-tuning never adapts them)."""
    import torch
    from transformers.pytorch_utils import Conv1D

    names: dict[str, None] = {}
    for name, mod in model.named_modules():
        if isinstance(mod, (torch.nn.Linear, torch.nn.Embedding, Conv1D)) and name:
            if not (multimodal and vision.part_of(name) != "language"):
                names.setdefault(name.rsplit(".", 1)[-1])
    return list(names)


def unmatched_targets(p, built) -> list[str]:
    """The lora.target_modules entries PEFT adapted nothing for in `built` (the run's adapter on the meta
    device). An entry counts as matched by a module PEFT targeted (its name, or a name ending in .entry, PEFT's
    rule), by GPT-OSS's fused experts it selects (lora_target_parameters), or by PEFT's own conversion of an
    MoE family's experts, which takes the MLP names out of the config and adapts expert parameters instead."""
    lm = built.base_model
    modules = lm.targeted_module_names
    kept = built.peft_config["default"].target_modules
    converted = bool(getattr(lm, "targeted_parameter_names", None)) and not isinstance(kept, str)
    model_type = getattr(p.model_config, "model_type", "")

    def hit(t: str) -> bool:
        return (any(n == t or n.endswith("." + t) for n in modules)
                or (not p.multimodal and bool(expert_targets(model_type, [t])))
                or (converted and t not in kept))

    return [t for t in p.cfg.lora.target_modules if not hit(t)]


def check_adapter(p) -> tuple[int | None, list[str]]:
    """The checks' part on MoE adapters (`p`: the run being resolved; LoRA methods only): (the adapter's size
    where PEFT built it, else None; notes). GPT-OSS: the expert
    parameters the HF path adds (lora_target_parameters), which take no dropout in PEFT. The families PEFT
    converts itself (Qwen2/3-MoE, Mixtral, OLMoE, ...; transformers 5 fused their experts into 3-D parameters):
    PEFT adapts the experts (gate_up_proj at rank 2r, with all-linear the router too) and refuses some target
    sets, e.g. gate_proj without up_proj (one fused parameter now). Their adapter is built on the meta device
    here, so that such a set is one line naming the field before any weights load or any file is written,
    and the memory plan counts what PEFT builds (the arithmetic knows GPT-OSS's experts only). On every
    model, dense ones too, each entry of a named target_modules list must adapt something in that build
    (unmatched_targets): PEFT itself refuses only a list of which nothing matches, after the weights loaded."""
    cfg, mc = p.cfg, p.model_config
    notes: list[str] = []
    experts = lora_target_parameters(p)
    if experts:
        if cfg.lora.dropout and p.backend == "hf":  # peft's ParamWrapper raises on it (Unsloth's path: not checked)
            raise UserError(f"lora.dropout: {cfg.lora.dropout}: PEFT's adapters on {mc.model_type}'s fused experts "
                            f"({', '.join(experts)}) take no dropout; set it to 0, or leave gate_proj/up_proj/"
                            "down_proj out of lora.target_modules")
        notes.append(f"lora: target_modules {cfg.lora.target_modules}, and on the fused experts target_parameters "
                       f"{', '.join(experts)} (one rank-{cfg.lora.r} adapter per expert)")
    converted = not experts and p.backend == "hf" and bool(moe_experts(mc))
    # Every entry must adapt something (all-linear always does); GPT-OSS's experts with dropout on Unsloth's path
    # are left to Unsloth (PEFT would refuse the dropout here, which the hf path refused above).
    named = cfg.lora.target_modules != "all-linear" and not (experts and cfg.lora.dropout)
    if not (converted or named):
        return None, notes
    from peft import get_peft_model
    from peft.utils import NoMatchingPeftModuleError

    model = meta_model(p)
    names = module_names(model, p.multimodal)
    try:
        built = get_peft_model(model, peft_config(p, model))
        unmatched = unmatched_targets(p, built) if named else []
    except NoMatchingPeftModuleError:  # no entry matched: each is named below, with what the model has
        built, unmatched = None, list(cfg.lora.target_modules)
    except ValueError as e:  # PeftError is one; only PEFT's target messages are about this field
        if "target" in str(e).lower():
            raise UserError(f"lora.target_modules: {cfg.lora.target_modules}: {e}") from None
        raise
    if unmatched:
        experts_too = "; the experts: gate_proj, up_proj, down_proj" if moe_experts(mc) else ""
        raise UserError(f"lora.target_modules: {', '.join(unmatched)} match{'es' if len(unmatched) == 1 else ''} "
                        f"no module of {mc.model_type} (its modules: {', '.join(names)}{experts_too}; or all-linear)")
    if not converted:
        return None, notes
    shapes = adapter_shapes(p, built)
    size = sum(math.prod(shape) for shape in shapes.values())
    notes.append(f"lora: PEFT adapts {mc.model_type}'s experts itself: {size:,} adapter parameters "
                 "(built on the meta device), counted in the memory plan")
    return size, notes
