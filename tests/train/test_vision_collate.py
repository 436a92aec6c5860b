"""The vision collator's host-side speed work changes no batch: each image processed once (OncePerImage) gives the
same ids, masks, pixels and labels as the processor run plainly; padding to a multiple adds only ignored padding."""

from __future__ import annotations

import pytest
import torch

from helpers.tiny_vision import turn_rows
from toolbox_train.models.vision import load_processor
from toolbox_train.training import vision
from toolbox_train.training.vision import OncePerImage, VisionCollator

FAMILIES = ["gemma3", "qwen2.5-vl", "qwen3-vl"]


class _Plain:
    """_ImagesOnce that does nothing: the processor runs as it would without the collator's cache."""

    def __init__(self, proc):
        self.proc = proc

    def __enter__(self):
        return self.proc

    def __exit__(self, *exc):
        pass


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("train_on", ["responses", "all"])
def test_images_once_changes_nothing(tmp_path, tiny_vlms, monkeypatch, family, train_on):
    proc = load_processor(str(tiny_vlms(family)))
    calls = []
    real = type(proc.image_processor).__call__
    monkeypatch.setattr(type(proc.image_processor), "__call__",
                        lambda self, images, **kw: calls.append(1) or real(self, images, **kw))
    rows = turn_rows(tmp_path)
    cached = VisionCollator(proc, 512, train_on)(rows)
    n_cached = len(calls)
    monkeypatch.setattr(vision, "_ImagesOnce", _Plain)
    plain = VisionCollator(proc, 512, train_on)(rows)
    assert sorted(cached) == sorted(plain)
    for key in plain:
        assert torch.equal(cached[key], plain[key]), key
    n_images = sum(len(r["images"]) for r in rows)
    assert n_cached == n_images  # each image once (a call per image), where the plain run calls per prefix too
    assert len(calls) - n_cached > n_cached / len(rows) if train_on == "responses" else True
    assert proc.image_processor.__class__ is not OncePerImage  # put back after the batch


@pytest.mark.parametrize("family", FAMILIES)
def test_padding_to_a_multiple_is_ignored_padding(tmp_path, tiny_vlms, family):
    proc = load_processor(str(tiny_vlms(family)))
    rows = turn_rows(tmp_path)
    exact = VisionCollator(proc, 512)(rows)
    padded = VisionCollator(proc, 512, pad_multiple=64)(rows)
    n, m = exact["input_ids"].shape[1], padded["input_ids"].shape[1]
    assert m % 64 == 0 and n <= m < n + 64
    assert torch.equal(padded["input_ids"][:, :n], exact["input_ids"])
    assert torch.equal(padded["labels"][:, :n], exact["labels"])
    assert (padded["labels"][:, n:] == -100).all() and (padded["attention_mask"][:, n:] == 0).all()
