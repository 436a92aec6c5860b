"""The memory planner on a vision-language model whose tower trains (issue 40): the tower's and projector's
parameters split as transformers builds them, the bytes a training tower keeps per patch as autograd's
saved-tensor hooks measure them, and the plan counting them where vision.train names the tower."""

from __future__ import annotations

import pytest
import torch

from toolbox_train.models import arithmetic as M
from toolbox_train.models.tower import tower as vision_tower
from toolbox_train.models.vision import part_of

TEXT = dict(vocab_size=100, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4,
            num_key_value_heads=2, head_dim=8)


def _model(kind: str, h: int = 64, i: int = 128, depth: int = 2):
    import transformers as tf

    rope = {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [1, 1, 2]}
    if kind == "siglip":
        cfg = tf.Gemma3Config(text_config=tf.Gemma3TextConfig(**TEXT).to_dict(), vision_config=tf.SiglipVisionConfig(
            hidden_size=h, intermediate_size=i, num_hidden_layers=depth, num_attention_heads=4, image_size=224,
            patch_size=14).to_dict(), mm_tokens_per_image=16)
        return cfg, tf.Gemma3ForConditionalGeneration(cfg)
    if kind == "qwen2.5":
        cfg = tf.Qwen2_5_VLConfig(text_config={**TEXT, "rope_parameters": rope}, vision_config=dict(
            depth=depth, hidden_size=h, intermediate_size=i, num_heads=4, out_hidden_size=32, patch_size=14,
            spatial_merge_size=2, temporal_patch_size=2, window_size=112, fullatt_block_indexes=[depth - 1]))
        return cfg, tf.Qwen2_5_VLForConditionalGeneration(cfg)
    cfg = tf.Qwen3VLConfig(text_config={**TEXT, "rope_parameters": {**rope, "mrope_interleaved": True}}, vision_config=dict(
        depth=depth, hidden_size=h, intermediate_size=i, num_heads=4, out_hidden_size=32, patch_size=14,
        spatial_merge_size=2, temporal_patch_size=2, num_position_embeddings=64, deepstack_visual_indexes=[0]))
    return cfg, tf.Qwen3VLForConditionalGeneration(cfg)


@pytest.mark.parametrize("kind", ["siglip", "qwen2.5", "qwen3"])
def test_tower_and_projector_parameters_are_the_models(kind):
    cfg, model = _model(kind)
    t = vision_tower(cfg.to_dict()["vision_config"], 32)
    by_part = {"vision": 0, "projector": 0, "language": 0}
    for name, p in model.named_parameters():
        by_part[part_of(name)] += p.numel()
    assert t.kind == kind
    assert (t.params, t.projector) == (by_part["vision"], by_part["projector"])
    assert M.Shape.from_config(cfg.to_dict()).extra_params == t.params + t.projector


def _saved_bytes(fn, params) -> int:
    """Bytes of distinct storages autograd keeps for backward (parameters excluded)."""
    ptrs = {p.untyped_storage().data_ptr() for p in params}
    seen: dict[int, int] = {}

    def pack(x):
        st = x.untyped_storage()
        if st.data_ptr() not in ptrs:
            seen.setdefault(st.data_ptr(), st.nbytes())
        return x

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda x: x):
        fn()
    return sum(seen.values())


def _tower_saved(kind, h, i, depth):
    cfg, model = _model(kind, h, i, depth)
    model = model.to(torch.bfloat16)
    if kind == "siglip":
        x = torch.randn(2, 3, 224, 224, dtype=torch.bfloat16)  # 2 images of 16x16 patches
        return _saved_bytes(lambda: model.model.vision_tower(pixel_values=x), list(model.parameters())), 512
    pv = torch.randn(256, 3 * 2 * 14 * 14, dtype=torch.bfloat16)  # 1 image of 16x16 patches
    return _saved_bytes(lambda: model.model.visual(pv, grid_thw=torch.tensor([[1, 16, 16]])),
                        list(model.parameters())), 256


@pytest.mark.parametrize("kind", ["siglip", "qwen2.5", "qwen3"])
@pytest.mark.parametrize("h, i", [(64, 128), (128, 256)])
def test_block_bytes_are_what_autograd_keeps(kind, h, i):
    (two, patches), (four, _) = _tower_saved(kind, h, i, 2), _tower_saved(kind, h, i, 4)
    per_block = (four - two) / 2 / patches
    t = vision_tower(_model(kind, h, i, 4)[0].to_dict()["vision_config"], 32)
    assert t.block_bytes(2) == pytest.approx(per_block, rel=0.01)
    # the whole tower: its blocks, and what the patch embedding and merger add beside them
    assert t.activation_bytes(patches, 2, checkpointing=False) == pytest.approx(four, rel=0.35)


@pytest.mark.parametrize("method", ["full", "lora"])
def test_the_plan_counts_a_training_tower(method):

    cfg, _ = _model("siglip", depth=4)
    shape = M.Shape.from_config(cfg.to_dict())
    base = M.Setting(method=method, batch=4, seq=256, precision="bf16", gradient_checkpointing=False,
                     patches_per_row=256)
    frozen = M.estimate(shape, base)
    trains = M.estimate(shape, M.Setting(**{**base.__dict__, "vision_train": ("language", "vision", "projector")}))
    act = shape.tower.activation_bytes(4 * 256, 2, checkpointing=False)
    assert trains.parts["vision_tower_activations"] == act and "vision_tower_activations" not in frozen.parts
    if method == "full":  # the tower's and projector's gradients and optimizer states on top
        extra = shape.tower.params + shape.tower.projector
        assert trains.parts["grads"] - frozen.parts["grads"] == extra * 2
        assert trains.parts["optimizer_states"] - frozen.parts["optimizer_states"] == extra * 4
    assert trains.peak - frozen.peak >= act
    ckpt = M.estimate(shape, M.Setting(**{**trains.setting.__dict__, "gradient_checkpointing": True}))
    assert ckpt.parts["vision_tower_activations"] < act  # block inputs kept, one block recomputed


def test_the_plan_takes_the_most_images_a_row_holds(tmp_path, tiny_vlms):
    """Preflight plans again at the most images a row of the data holds (the first plan, from config.json, counts
    one): the training tower's activations and the peak grow by the patches of the extra images; a frozen tower's
    plan does not change."""
    import json

    from helpers.tiny import train_config
    from helpers.tiny_vision import image_rows
    from toolbox_train.planning import preflight, run as R

    model = tiny_vlms("gemma3")

    def planned(per_row: int, parts: list[str]):
        folder = tmp_path / f"d{per_row}-{len(parts)}"
        rows = image_rows(4, folder / "images")
        for r in rows:  # the row's user turn asks about `per_row` copies of its picture
            r["messages"][0]["content"] = [{"type": "image"}] * per_row + [{"type": "text", "text": "what colour?"}]
            r["images"] = r["images"] * per_row
        (folder / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        cfg = train_config(model, folder / "train.jsonl", tmp_path / f"out{per_row}-{len(parts)}",
                           **{"vision.train": parts, "data.max_seq_length": 256})
        p = R.resolve(cfg, device_memory="8GiB", probe_device=False)
        p, _, _ = preflight.validate(p)
        return p.memory.estimate()

    one, three = planned(1, ["language", "vision"]), planned(3, ["language", "vision"])
    assert three.setting.patches_per_row == 3 * one.setting.patches_per_row > 0
    assert three.parts["vision_tower_activations"] == pytest.approx(3 * one.parts["vision_tower_activations"])
    assert three.peak > one.peak
    frozen_one, frozen_three = planned(1, ["language"]), planned(3, ["language"])
    assert frozen_three.peak == frozen_one.peak and "vision_tower_activations" not in frozen_three.parts
