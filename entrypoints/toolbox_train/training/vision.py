"""Vision-language SFT: the model's processor, and the collator that turns image rows (data/images.py)
into a batch with its labels.

The labels are computed here, after the processor has expanded each image marker into the image's
tokens: `apply_chat_template(return_assistant_tokens_mask=True)` locates the answer by text offsets
taken before that expansion (wrong on image rows), and TRL 1.15's vision collator with
assistant_only_loss gives 0 targets on Gemma 3 (a NaN loss), without it trains on the image tokens.
Each assistant turn's tokens are those between the conversation up to that turn, rendered with the
generation prompt, and the conversation through it, each run through the processor with its images.
"""

from __future__ import annotations

from typing import Any

from toolbox_train.contract import UserError
from toolbox_train.data.images import image_parts, load_image
from toolbox_train.models.vision import image_token_ids

IGNORE = -100
PAD_MULTIPLE = 64  # a GPU run's image batches: lengths in steps of 64 tokens (VisionCollator)


def _render(proc, messages, generation_prompt: bool = False) -> str:
    return proc.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation_prompt)


def _length(proc, text: str, images: list) -> int:
    out = proc(text=[text], images=[images] if images else None, add_special_tokens=False, return_tensors="pt")
    return len(out["input_ids"][0])


class OncePerImage:
    """A processor's image processor that processes each image once while the collator holds it: the labels need
    each assistant turn's prefix through the processor with its images (1 + 2 x turns calls a row), and the image
    work (resizing, normalising) is most of a batch's host time (an 896 px Gemma 3 row: ~3x the processor alone).
    Exact where the image processor treats images one by one (Gemma 3's SigLIP, Qwen2.5-VL's and Qwen3-VL's
    patches): each image's outputs are joined along their first axis, as the batched call does
    (tests/train/test_vision_collate.py compares the two)."""

    def __init__(self, real):
        self.real, self.cache = real, {}

    def __getattr__(self, name):
        return getattr(self.real, name)

    def __call__(self, images, **kw):
        import numpy as np
        import torch
        from transformers.feature_extraction_utils import BatchFeature
        from transformers.image_utils import make_flat_list_of_images

        parts = []
        for im in make_flat_list_of_images(images):
            if id(im) not in self.cache:  # the images live as long as the collator call: ids are stable
                self.cache[id(im)] = (im, self.real([im], **kw))
            parts.append(self.cache[id(im)][1])
        joined = {}
        for key in parts[0].keys():
            vals = [p[key] for p in parts]
            joined[key] = (torch.cat(vals) if torch.is_tensor(vals[0]) else
                           np.concatenate(vals) if isinstance(vals[0], np.ndarray) else
                           [x for v in vals for x in v])
        return BatchFeature(joined)


class _ImagesOnce:
    def __init__(self, proc):
        self.proc = proc

    def __enter__(self):
        self.real = getattr(self.proc, "image_processor", None)
        if self.real is not None:
            self.proc.image_processor = OncePerImage(self.real)
        return self.proc

    def __exit__(self, *exc):
        if self.real is not None:
            self.proc.image_processor = self.real


def assistant_spans(proc, messages: list, images: list, full_text: str, full_len: int) -> list[tuple[int, int]]:
    """The token ranges [start, end) of each assistant turn in the processed conversation."""
    spans = []
    for k, m in enumerate(messages):
        if m["role"] != "assistant":
            continue
        before = messages[:k]
        n = sum(image_parts(x["content"]) for x in before)
        prompt = _render(proc, before, generation_prompt=True)
        through = _render(proc, messages[:k + 1])
        if not (full_text.startswith(through) and through.startswith(prompt)):
            raise ValueError("the chat template does not render a conversation's turns as prefixes of it "
                             "(assistant turns cannot be located)")
        end = full_len if through == full_text else _length(proc, through, images[:n])
        spans.append((_length(proc, prompt, images[:n]), end))
    return spans


class VisionCollator:
    """Image rows -> the processor's batch (input_ids, attention_mask, pixel_values, ...) and `labels`:
    the assistant turns (train_on: responses) or every token (all), never padding or image tokens."""

    def __init__(self, processor, max_length: int | None, train_on: str = "responses", pad_multiple: int = 1):
        self.proc = processor
        self.max_length = max_length
        self.train_on = train_on
        # Padded to a multiple (GPU runs: PAD_MULTIPLE): a batch's length takes a few values instead of every one,
        # and each new length is a new shape for the kernels that are built per shape (cuDNN's attention, Triton's).
        self.pad_multiple = pad_multiple
        self.image_ids = sorted(image_token_ids(processor))

    def __call__(self, examples: list[dict[str, Any]]) -> dict[str, Any]:
        with _ImagesOnce(self.proc):
            return self._collate(examples)

    def _collate(self, examples: list[dict[str, Any]]) -> dict[str, Any]:
        import torch

        images = [[load_image(s) for s in ex["images"] or []] for ex in examples]
        texts = [_render(self.proc, ex["messages"]) for ex in examples]
        pad = {"pad_to_multiple_of": self.pad_multiple} if self.pad_multiple > 1 else {}
        batch = self.proc(text=texts, images=images if any(images) else None, padding=True, padding_side="right",
                          return_tensors="pt", add_special_tokens=False, **pad)
        ids, attn = batch["input_ids"], batch["attention_mask"]
        labels = torch.full_like(ids, IGNORE)
        for i, ex in enumerate(examples):
            if self.train_on == "all":
                labels[i] = torch.where(attn[i].bool(), ids[i], IGNORE)
                continue
            for start, end in assistant_spans(self.proc, ex["messages"], images[i], texts[i], int(attn[i].sum())):
                labels[i, start:end] = ids[i, start:end]
        if self.image_ids:
            labels[torch.isin(ids, torch.tensor(self.image_ids))] = IGNORE
        batch["labels"] = labels
        return self._truncated(batch)

    def _truncated(self, batch):
        """Cut to max_length; an image whose tokens would be cut is refused (the model would fail on it)."""
        import torch

        n = batch["input_ids"].shape[1]
        if self.max_length is None or n <= self.max_length:
            return batch
        cut = batch["input_ids"][:, self.max_length:]
        if self.image_ids and torch.isin(cut, torch.tensor(self.image_ids)).any():
            raise UserError(f"data.max_seq_length: {self.max_length} cuts into a row's image tokens (the batch's "
                            f"rows are up to {n} tokens long); raise it")
        for key, v in batch.items():
            if torch.is_tensor(v) and v.dim() == 2 and v.shape[1] == n and key not in ("pixel_values",):
                batch[key] = v[:, :self.max_length]
        return batch


def converted_resume(model) -> bool:
    """A whole vision-language model (not a PEFT adapter) whose checkpoints are saved under other names than
    its parameters': transformers 5.17's Trainer loads them with load_state_dict and, finding none of its
    names, warns and trains on from the base weights (transformers issue 43701)."""
    from peft import PeftModel

    return not isinstance(model, PeftModel) and bool(getattr(model, "_weight_conversions", None)) \
        and getattr(model.config, "vision_config", None) is not None


def load_converted(model, checkpoint: str) -> None:
    """The checkpoint's weights into `model`, read back through from_pretrained (which renames them)."""
    from transformers import AutoModelForImageTextToText

    dtype = next(model.parameters()).dtype
    saved = AutoModelForImageTextToText.from_pretrained(checkpoint, dtype=dtype, device_map="cpu").state_dict()
    missing, unexpected = model.load_state_dict(saved, strict=False)
    tied = set(getattr(model, "all_tied_weights_keys", None) or {})
    missing = [k for k in missing if k not in tied]
    if missing or unexpected:  # never train on from weights the checkpoint did not give
        raise RuntimeError(f"{checkpoint}: the checkpoint's weights do not fit the model: missing {missing[:3]}, "
                           f"unexpected {unexpected[:3]}")
