"""The model-family table: what the toolbox knows of a family by its config.json `model_type`, in one place.

`family(model_type)` gives a frozen `Family`: the text decoder's quirks the memory arithmetic needs (q/k norms,
norms per layer, Gemma's fp32 norm copies, an attention with no sdpa, fused MoE experts that LoRA reaches
through PEFT's target_parameters), Unsloth's loader, a vision-language model's tower kind, the module paths of
its vision tower and projector, the tokens and markers an image becomes, and the notes its export gives, and
transformers' default pattern of sliding-window layers. A key covers its variants: a model_type not in the table
takes the longest key it starts with (`gemma3` covers gemma3_text and gemma3n, `qwen3` qwen3_moe, `qwen3_vl`
qwen3_vl_text); none: `DEFAULT`.

Who reads it: models/arithmetic.py (the decoder's quirks, fused experts), models/tower.py (the tower kind and
its arithmetic's constants), models/vision.py (parts by module path, image tokens), models/lora.py and
training/loading.py (the parts text fine-tuning freezes, Unsloth's loader), export/projector.py (the published
tensor prefixes), runs/folder.py (export notes), bench/measure.py and bench/shapes.py. A module path means the
same in every family, so vision.py matches the union of every entry's paths (`every_family`).

Adding a family is one entry in FAMILIES plus its tiny-model test (tests/train/test_families.py shows an entry
is all the vision, tower and plan code need); a tower of a new kind is an entry in TOWERS too, and one of a new
layout its arithmetic in models/tower.py. No torch here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

# The decoder's linear modules (Llama's names, which every family here uses): lora.target_modules' all-linear.
LORA_ALL_LINEAR = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@dataclass(frozen=True)
class TowerKind:
    """A vision tower's kind, for models/tower.py's arithmetic (parameters, bytes per patch)."""

    name: str  # Tower.kind, the word the plan and the tests use
    vision_types: tuple[str, ...]  # vision_config.model_type of this tower, as transformers writes it
    layout: str  # "vit": num_hidden_layers blocks at a fixed image size, a linear projector; "merger": `depth`
    # blocks, a patch merger as the projector
    gated_mlp: bool  # merger towers: a gated SiLU MLP with RMSNorms, or a GELU MLP with LayerNorms, learned
    # position embeddings and deepstack mergers
    block_bytes: tuple[int, int]  # bytes per patch per block = e * (H * h + I * i) + 24 (measured: models/tower.py)
    published: tuple[str, str] | None = None  # (saved prefix, published prefix): llama.cpp's converter wants the
    # published layout, transformers 5.17 saves the short one (export/projector.py)


SIGLIP = TowerKind("siglip", ("siglip_vision_model",), "vit", False, (8, 2),
                   published=("vision_tower.", "vision_tower.vision_model."))
QWEN25_VL = TowerKind("qwen2.5", ("qwen2_5_vl_vision",), "merger", True, (15, 4))
QWEN3_VL = TowerKind("qwen3", ("qwen3_vl_vision",), "merger", False, (11, 2))
TOWERS = (SIGLIP, QWEN25_VL, QWEN3_VL)


@dataclass(frozen=True)
class Family:
    name: str  # as a message names it
    # the text decoder (models/arithmetic.py)
    qk_norm: bool = False  # norms on q and k per head
    norms_per_layer: int = 2
    fp32_norms: bool = False  # HF's RMSNorm keeps two fp32 tensors per normed element (Gemma's), not fp32 + bf16
    eager_attention: bool = False  # transformers has no sdpa for it: eager attention's scores are kept
    full_attention_every: int = 0  # transformers' default layer_types: every n-th layer full, the others sliding
    # fused MoE experts: (the expert parameter PEFT suffix-matches, the MLP names in lora.target_modules that select
    # it); each layer's experts are 3-D nn.Parameters that `target_modules` never matches
    fused_experts: tuple[tuple[str, tuple[str, ...]], ...] = ()
    unsloth_fast_model: bool = False  # Unsloth loads it with FastModel (else FastLanguageModel, text only)
    # a vision-language model (models/vision.py, models/tower.py)
    tower: TowerKind | None = None  # None: guessed from the vision_config's fields (tower_of)
    tower_paths: tuple[str, ...] = ()  # module path segments of the vision tower
    projector_paths: tuple[str, ...] = ()  # ... of the projector into the text model (trained whole, never LoRA)
    token_attrs: tuple[str, ...] = ()  # processor / tokenizer attributes naming an image's tokens and markers
    image_markers: tuple[str, ...] = ()  # their strings where no attribute names them
    # export (runs/folder.py)
    export_note: str = ""
    gguf_note: str = ""


_QWEN_VL = dict(tower_paths=("visual",), projector_paths=("visual.merger",),
                token_attrs=("image_token", "video_token", "vision_start_token", "vision_end_token"),
                # the strings transformers' own Qwen-VL processors fall back to (5.17's Qwen2_5_VLProcessor names
                # only image_token / video_token)
                image_markers=("<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"))
_VIT_PARTS = dict(tower_paths=("vision_tower",), projector_paths=("multi_modal_projector",),
                  token_attrs=("image_token",))

FAMILIES: dict[str, Family] = {
    "gemma": Family("Gemma", fp32_norms=True),
    "gemma2": Family("Gemma 2", norms_per_layer=4, fp32_norms=True),
    "gemma3": Family("Gemma 3", qk_norm=True, norms_per_layer=4, fp32_norms=True, unsloth_fast_model=True,
                     full_attention_every=6,
                     tower=SIGLIP, **{**_VIT_PARTS, "token_attrs": ("image_token", "boi_token", "eoi_token")},
                     image_markers=("<start_of_image>", "<end_of_image>", "<image_soft_token>")),
    "olmo2": Family("OLMo 2", qk_norm=True),
    "qwen3": Family("Qwen3", qk_norm=True),
    "qwen2_5_vl": Family("Qwen2.5-VL", tower=QWEN25_VL, **_QWEN_VL),
    "qwen3_vl": Family("Qwen3-VL", qk_norm=True, tower=QWEN3_VL, **_QWEN_VL),
    "gpt_oss": Family("GPT-OSS", eager_attention=True, full_attention_every=2,  # attention sinks: no sdpa
                      # Unsloth's get_peft_model does the same for it (get_moe_target_parameters); Qwen2/3-MoE,
                      # OLMoE, DeepSeek and the others PEFT 0.21 converts itself to its qwen2_moe/mixtral layout
                      # (peft/utils/transformers_weight_conversion.py, docs/training.md) need no entry
                      fused_experts=(("mlp.experts.gate_up_proj", ("gate_proj", "up_proj")),
                                     ("mlp.experts.down_proj", ("down_proj",))),
                      export_note="experts are exported de-quantized (16-bit), not in the original MXFP4",
                      gguf_note="--quant mxfp4_moe re-quantizes them for llama.cpp"),
    "llava": Family("LLaVA", **_VIT_PARTS),
    "mistral3": Family("Mistral 3", **_VIT_PARTS),
    "idefics3": Family("Idefics3", tower_paths=("vision_model",), projector_paths=("connector",)),
    "smolvlm": Family("SmolVLM", tower_paths=("vision_model",), projector_paths=("connector",)),
}

# A model_type in no entry: a plain decoder; its vision parts told by every path name of the table, and
# mm_projector (LLaVA's original code's projector).
DEFAULT = Family("", projector_paths=("mm_projector",))


def family(model_type: str | None) -> Family:
    """The family of a config.json `model_type`: its entry, else the longest key it starts with, else DEFAULT."""
    mt = model_type or ""
    if mt in FAMILIES:
        return FAMILIES[mt]
    keys = [k for k in FAMILIES if mt.startswith(k)]
    return FAMILIES[max(keys, key=len)] if keys else DEFAULT


def every_family(field: str) -> tuple[str, ...]:
    """Every family's `tower_paths`, `projector_paths`, `token_attrs` or `image_markers`, in table order."""
    seen: dict[str, None] = {}
    for f in (*FAMILIES.values(), DEFAULT):
        seen.update(dict.fromkeys(getattr(f, field)))
    return tuple(seen)


def vision_tower_kind(vision_type: str | None) -> TowerKind | None:
    """The tower kind of a vision_config.model_type, or None."""
    return next((t for t in TOWERS if vision_type in t.vision_types), None)


def tower_of(v: Mapping[str, Any], model_type: str | None = None) -> TowerKind:
    """The tower kind of a vision_config: its family's (config.json's model_type), else its own model_type's,
    else guessed from its fields as for a model in no entry (no `depth`: a ViT; deepstack indexes or learned
    position embeddings: the GELU merger tower; else the gated one)."""
    known = family(model_type).tower or vision_tower_kind(v.get("model_type"))
    if known is not None:
        return known
    if not v.get("depth"):
        return SIGLIP
    return QWEN3_VL if v.get("deepstack_visual_indexes") is not None or v.get("num_position_embeddings") else QWEN25_VL
