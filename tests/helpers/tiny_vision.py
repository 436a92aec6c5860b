"""Tiny vision-language models (Gemma 3, Qwen2.5-VL, Qwen3-VL) built from config, each saved with its own
processor, and small image datasets; nothing comes from a hub.

The processor is the family's own class around the local tokenizer (helpers/tiny.py), an image
processor at a small fixed size, and a chat template that renders image parts with the family's
marker (Gemma 3: <boi>; Qwen-VL: <|vision_start|><|image_pad|><|vision_end|>).
"""

from __future__ import annotations

import base64
import io
import json
import os
import random
from pathlib import Path
from typing import Any

import pytest

from .tiny import _sentences, make_tokenizer

FAMILIES = ("gemma3", "qwen2.5-vl", "qwen3-vl")
GEMMA_TOKENS = {"boi_token": "<boi>", "eoi_token": "<eoi>", "image_token": "<image>"}
QWEN_TOKENS = ["<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"]
IMAGE_MARK = {"gemma3": "<boi>", "qwen2.5-vl": "<|vision_start|><|image_pad|><|vision_end|>",
              "qwen3-vl": "<|vision_start|><|image_pad|><|vision_end|>"}
GEMMA_TOKENS_PER_IMAGE = 4  # SigLIP at 28x28 with 14-pixel patches: 4 patches, pooled to 4 tokens


def chat_template(family: str) -> str:
    """The tiny tokenizer's chat template (helpers/tiny.py, no generation markers), with image parts."""
    part = ("{% for part in message['content'] %}{% if part['type'] == 'image' %}" + IMAGE_MARK[family]
            + "{% elif part['type'] == 'text' %}{{ part['text'] }}{% endif %}{% endfor %}")
    return ("{% for message in messages %}<|{{ message['role'] }}|>"
            "{% if message['content'] is string %}{{ message['content'] }}{% else %}" + part + "{% endif %}"
            "<|end|>\n{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}")


def has_torchvision() -> bool:
    """transformers 5.17's Qwen-VL processors need a video processor, which needs torchvision."""
    import importlib.util

    if importlib.util.find_spec("torchvision") is None:
        return False
    try:
        import torchvision  # noqa: F401  (a CUDA build fails to import with the CPU torch)
    except Exception:
        return False
    return True


def require_torchvision() -> None:
    """Skips the test where torchvision does not import; in CI (CI=true, the rule of helpers/enginekit.py) fails
    it: .ci/setup venv installs one (with .ci/torchvision_cpu.py's shim beside a CPU torch), so the Qwen-VL
    processor tests never skip there unseen."""
    if has_torchvision():
        return
    msg = "Qwen-VL processors need torchvision (transformers 5.17's video processor); .ci/setup venv installs it"
    if os.environ.get("CI") == "true":
        pytest.fail(msg)
    pytest.skip(msg)


def _ids(tok, markers) -> dict[str, int]:
    """The image markers' ids, and pad/bos/eos under the tiny tokenizer's names whatever the vocabulary calls them."""
    ids = {t: tok.convert_tokens_to_ids(t) for t in markers}
    return {**ids, "<pad>": tok.pad_token_id, "<s>": tok.bos_token_id, "</s>": tok.eos_token_id}


def _gemma3(dir: Path):
    import transformers as tf
    from transformers.models.gemma3.image_processing_pil_gemma3 import Gemma3ImageProcessorPil

    tok = tf.AutoTokenizer.from_pretrained(dir, extra_special_tokens=GEMMA_TOKENS)
    ids = _ids(tok, ("<boi>", "<eoi>", "<image>"))
    text = tf.Gemma3TextConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                               num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=256,
                               sliding_window=32, query_pre_attn_scalar=8, pad_token_id=ids["<pad>"],
                               bos_token_id=ids["<s>"], eos_token_id=ids["</s>"])
    vision = tf.SiglipVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                                   image_size=28, patch_size=14)
    cfg = tf.Gemma3Config(text_config=text.to_dict(), vision_config=vision.to_dict(),
                          mm_tokens_per_image=GEMMA_TOKENS_PER_IMAGE, boi_token_index=ids["<boi>"],
                          eoi_token_index=ids["<eoi>"], image_token_index=ids["<image>"])
    images = Gemma3ImageProcessorPil(size={"height": 28, "width": 28})
    proc = tf.Gemma3Processor(image_processor=images, tokenizer=tok, chat_template=chat_template("gemma3"),
                              image_seq_length=GEMMA_TOKENS_PER_IMAGE)
    return cfg, tf.Gemma3ForConditionalGeneration, proc


def _qwen_processor(tok, family: str):
    """The Qwen-VL family's processor around `tok`, or None where torchvision does not import (its video processor
    needs it). 28x28 pixels: 2x2 patches of 14, merged 2x2 into one token per image."""
    if not has_torchvision():
        return None
    import transformers as tf
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    if family == "qwen2.5-vl":
        from transformers.models.qwen2_vl.video_processing_qwen2_vl import Qwen2VLVideoProcessor as video
        cls = tf.Qwen2_5_VLProcessor
    else:
        from transformers.models.qwen3_vl.video_processing_qwen3_vl import Qwen3VLVideoProcessor as video
        cls = tf.Qwen3VLProcessor
    images = Qwen2VLImageProcessorPil(min_pixels=28 * 28, max_pixels=28 * 28, patch_size=14, merge_size=2,
                                      temporal_patch_size=2)
    return cls(image_processor=images, tokenizer=tok, video_processor=video(), chat_template=chat_template(family))


def _qwen25vl(dir: Path, depth: int = 1):
    import transformers as tf

    tok = tf.AutoTokenizer.from_pretrained(dir, extra_special_tokens=QWEN_TOKENS)
    ids = _ids(tok, QWEN_TOKENS)
    text = dict(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, max_position_embeddings=256, pad_token_id=ids["<pad>"],
                bos_token_id=ids["<s>"], eos_token_id=ids["</s>"],
                rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [1, 1, 2]})
    vision = dict(depth=depth, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=32, patch_size=14,
                  spatial_merge_size=2, temporal_patch_size=2, window_size=56,
                  fullatt_block_indexes=[0] if depth == 1 else list(range(1, depth, 2)))  # windowed blocks between
    cfg = tf.Qwen2_5_VLConfig(text_config=text, vision_config=vision, image_token_id=ids["<|image_pad|>"],
                              video_token_id=ids["<|video_pad|>"], vision_start_token_id=ids["<|vision_start|>"],
                              vision_end_token_id=ids["<|vision_end|>"])
    return cfg, tf.Qwen2_5_VLForConditionalGeneration, _qwen_processor(tok, "qwen2.5-vl")


def _qwen3vl(dir: Path, depth: int = 1):
    import transformers as tf

    tok = tf.AutoTokenizer.from_pretrained(dir, extra_special_tokens=QWEN_TOKENS)
    ids = _ids(tok, QWEN_TOKENS)
    text = dict(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, head_dim=8, max_position_embeddings=256, pad_token_id=ids["<pad>"],
                rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [1, 1, 2],
                                 "mrope_interleaved": True})
    # deepstack: the one block's features also fed into the first language layers
    vision = dict(depth=depth, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=32, patch_size=14,
                  spatial_merge_size=2, temporal_patch_size=2, num_position_embeddings=16, deepstack_visual_indexes=[0])
    cfg = tf.Qwen3VLConfig(text_config=text, vision_config=vision, image_token_id=ids["<|image_pad|>"],
                           video_token_id=ids["<|video_pad|>"], vision_start_token_id=ids["<|vision_start|>"],
                           vision_end_token_id=ids["<|vision_end|>"], bos_token_id=ids["<s>"], eos_token_id=ids["</s>"])
    return cfg, tf.Qwen3VLForConditionalGeneration, _qwen_processor(tok, "qwen3-vl")


def make_tiny_vlm(dir: str | Path, family: str = "gemma3", seed: int = 0, tokenizer: Path | None = None,
                  depth: int = 1) -> Path:
    """A random-init tiny VLM of `family` with its processor, saved in `dir` (Qwen2.5-VL's processor only
    where torchvision imports: has_torchvision); on the tiny tokenizer, or a copy of the one in `tokenizer`
    (a real vocabulary: llama.cpp's converter recognises only those). `depth`: Qwen-VL's vision blocks (llama.cpp's
    converter maps the merger's `mlp.2` by block number: it needs 3)."""
    import shutil

    import torch

    dir = Path(dir)
    if tokenizer is None:
        make_tokenizer(dir)
    else:
        shutil.copytree(tokenizer, dir, dirs_exist_ok=True)
    build = {"gemma3": _gemma3, "qwen2.5-vl": _qwen25vl, "qwen3-vl": _qwen3vl}[family]
    cfg, cls, proc = build(dir) if family == "gemma3" else build(dir, depth)
    torch.manual_seed(seed)
    model = cls(cfg).to(torch.float32)
    if family == "gemma3":
        # HF initialises Gemma 3's projector at zero (image features would vanish): give it weights.
        with torch.no_grad():
            model.model.multi_modal_projector.mm_input_projection_weight.normal_(0, 0.05)
    model.save_pretrained(dir, safe_serialization=True)
    if proc is not None:
        proc.save_pretrained(dir)
    return dir


COLOURS = {"red": (220, 30, 30), "green": (30, 200, 40), "blue": (30, 60, 220), "yellow": (230, 220, 30)}


def png_bytes(colour: str, size: int = 28) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (size, size), COLOURS[colour]).save(buf, format="PNG")
    return buf.getvalue()


def image_rows(n: int, folder: Path | None = None, embed: bool = False, seed: int = 0) -> list[dict[str, Any]]:
    """`n` chat rows, one image each ("what colour?" -> the colour and a sentence); the images written
    into `folder` (paths relative to its parent, the data file's folder) or embedded as base64."""
    rnd = random.Random(seed)
    sents = _sentences(n, seed)
    rows = []
    for i in range(n):
        colour = rnd.choice(sorted(COLOURS))
        if embed:
            image: Any = {"bytes": base64.b64encode(png_bytes(colour)).decode()}
        else:
            assert folder is not None
            folder.mkdir(parents=True, exist_ok=True)
            (folder / f"{i}.png").write_bytes(png_bytes(colour))
            image = f"{folder.name}/{i}.png"
        rows.append({
            "messages": [
                {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "what colour?"}]},
                {"role": "assistant", "content": [{"type": "text", "text": f"{colour}. {sents[i]}"}]},
            ],
            "images": [image],
        })
    return rows


def write_image_dataset(path: str | Path, n: int = 16, embed: bool = False, seed: int = 0) -> Path:
    """JSONL image rows at `path`, their PNGs in `images/` beside it (or embedded)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    rows = image_rows(n, path.parent / "images", embed, seed)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def turn_rows(folder: Path, n: int = 3) -> list[dict[str, Any]]:
    """`n` one-image rows (absolute image paths under `folder`) and one row of two turns with an image in each:
    two assistant turns to find, images in two user turns."""
    rows = image_rows(n, folder / "images")
    for r in rows:
        r["images"] = [str(folder / p) for p in r["images"]]
    two = image_rows(2, folder / "images2", seed=1)
    rows.append({"messages": rows[0]["messages"] + two[1]["messages"],
                 "images": rows[0]["images"] + [str(folder / two[1]["images"][0])]})
    return rows


def labels_from_ids(tok, ids, attn, unlabelled, train_on: str = "responses"):
    """Labels from the token ids alone (the tiny chat template's roles): every token after an <|assistant|> token
    up to the next <|user|> token or the padding (responses), or every non-padding token (all); never a token
    of `unlabelled`."""
    import torch

    ast, user = tok.convert_tokens_to_ids("<|assistant|>"), tok.convert_tokens_to_ids("<|user|>")
    out = torch.full_like(ids, -100)
    for i in range(ids.shape[0]):
        inside = train_on == "all"
        for j in range(int(attn[i].sum())):
            t = int(ids[i, j])
            if t == user:
                inside = train_on == "all"
            if inside and t not in unlabelled:
                out[i, j] = t
            if t == ast:
                inside = True
    return out
