"""A vision-language model's vision tower and projector in the memory arithmetic: their parameters (split, so
that `vision.train` can train one and not the other) and the bytes autograd keeps per image patch while the
tower trains. No torch: config.json's vision_config alone.

Three tower kinds (models/families.py's TOWERS says which family has which): SigLIP (Gemma 3: LayerNorm,
attention, a GELU MLP), Qwen2.5-VL (RMSNorm, rotary attention, a gated SiLU MLP) and Qwen3-VL (LayerNorm,
rotary attention, a GELU MLP, learned position embeddings, deepstack mergers counted with the tower as
models/vision.py's part_of does); this module has their arithmetic by layout. The bytes per patch and
block (families.TowerKind.block_bytes) were measured with autograd's saved-tensor hooks on bf16 towers of
two widths each (tests/train/test_vision_plan.py keeps them true): SigLIP e(8h + 2i) + 24, Qwen2.5-VL
e(15h + 4i) + 24, Qwen3-VL e(11h + 2i) + 24 (h the tower's width, i its MLP's, e bytes per element; the
24: fp32 norm statistics).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from toolbox_train.models.families import tower_of


@dataclass(frozen=True)
class Tower:
    kind: str  # families.TowerKind.name
    hidden: int
    intermediate: int
    layers: int
    params: int  # the tower (blocks, patch and position embeddings; Qwen3-VL's deepstack mergers)
    projector: int  # into the text model: Gemma 3's projection and its norm, Qwen's patch merger
    coefficients: tuple[int, int] = (0, 0)  # families.TowerKind.block_bytes: (H, I)
    linear: int = 0  # the blocks' nn.Linear weights (what bitsandbytes quantizes under QLoRA on the HF backend)

    def block_bytes(self, e: int) -> float:
        """Bytes autograd keeps per patch for one block while the tower trains (no checkpointing)."""
        hh, ii = self.coefficients
        return e * (hh * self.hidden + ii * self.intermediate) + 24

    def activation_bytes(self, patches: int, e: int, checkpointing: bool) -> float:
        """What the tower keeps for backward over `patches` patches (every image of a batch): each block's
        working set, or under checkpointing each block's input and one block recomputed."""
        if not checkpointing:
            return self.layers * self.block_bytes(e) * patches
        return (self.layers * self.hidden * e + self.block_bytes(e)) * patches


def tower(v: Mapping[str, Any], text_hidden: int, model_type: str | None = None) -> Tower:
    """The tower and projector of a vision_config (Qwen's blocks counted as `depth`); `model_type`: config.json's,
    whose family names the tower kind (families.tower_of)."""
    h, i = v.get("hidden_size", 0), v.get("intermediate_size", 0)
    patch, img = v.get("patch_size", 14), v.get("image_size", 224)
    tk = tower_of(v, model_type)
    kind, co = tk.name, tk.block_bytes
    if tk.layout == "vit":  # SigLIP
        L = v.get("num_hidden_layers", 0)
        per_layer = 4 * h * h + 4 * h + 2 * h * i + i + h + 4 * h
        # patch embedding with bias, position embeddings, the final LayerNorm; the pooling head transformers
        # builds unless vision_use_head is false (Gemma 3's real configs say false: the tower's output is used)
        head = 4 * h * h + 2 * h * i + 8 * h + i if v.get("vision_use_head", True) else 0
        params = L * per_layer + 3 * patch * patch * h + h + (img // patch) ** 2 * h + 2 * h + head
        return Tower(kind, h, i, L, params, h * text_hidden + h, co, L * (4 * h * h + 2 * h * i))
    L, merge, out = v["depth"], v.get("spatial_merge_size", 2), v.get("out_hidden_size", text_hidden)
    m = h * merge ** 2
    embed = 3 * v.get("temporal_patch_size", 2) * patch * patch * h
    if tk.gated_mlp:  # Qwen2.5-VL: a gated MLP with biases, RMSNorms, no patch-embedding bias; the merger's
        # RMSNorm over h
        per_layer = 4 * h * h + 3 * h * i + 2 * i + 7 * h
        return Tower(kind, h, i, L, L * per_layer + embed, m * m + m + m * out + out + h, co,
                     L * (4 * h * h + 3 * h * i))
    # Qwen3-VL: LayerNorms, a GELU MLP; a Conv3d patch embedding with bias; learned position embeddings; the
    # merger's LayerNorm over h, each deepstack merger's over the merged width
    per_layer = 4 * h * h + 2 * h * i + 9 * h + i
    merger = m * m + m + m * out + out
    deepstack = len(v.get("deepstack_visual_indexes") or []) * (merger + 2 * m)
    params = L * per_layer + embed + h + v.get("num_position_embeddings", 0) * h + deepstack
    return Tower(kind, h, i, L, params, merger + 2 * h, co, L * (4 * h * h + 2 * h * i))
