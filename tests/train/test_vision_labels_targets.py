"""Issue 44's label and adapter defects, every family (Gemma 3, Qwen2.5-VL, Qwen3-VL), checked against
expectations written here, never taken from the code under test (models/vision.py, training/vision.py):
- the labels of image rows, from the token ids alone: the ids of the image markers are looked up here from
  their literal strings (and checked against the model config's token id fields); no marker, image token or
  padding carries a label (docs/training.md: "Image tokens (the processor's image, begin/end-of-image, vision
  start/end tokens) and padding never carry a label"), for train_on all and responses;
- the loss of step 1 of a real finetune run against a plain HF forward with those labels;
- LoRA's targets: the adapted modules are exactly the nn.Linear modules under each trained part's module path
  (written here per family), never a convolution or the LM head; the projector trains whole."""

from __future__ import annotations

import dataclasses
import itertools
import json

import pytest
import torch
from safetensors import safe_open

from helpers.tiny import train_config
from helpers.tiny_vision import labels_from_ids, turn_rows, write_image_dataset
from toolbox_train.commands import finetune
from toolbox_train.data.images import load_image
from toolbox_train.models.vision import load_processor
from toolbox_train.training.vision import VisionCollator

FAMILIES = ["gemma3", "qwen2.5-vl", "qwen3-vl"]
# The tokens an image becomes or is framed by, as the tiny models' tokenizers spell them (helpers/tiny_vision.py;
# the real Gemma 3 spells them <start_of_image>, <image_soft_token>, <end_of_image>), and the config fields
# naming the same ids, in the same order.
MARKERS = {"gemma3": ("<boi>", "<image>", "<eoi>"),
           "qwen2.5-vl": ("<|vision_start|>", "<|image_pad|>", "<|vision_end|>", "<|video_pad|>"),
           "qwen3-vl": ("<|vision_start|>", "<|image_pad|>", "<|vision_end|>", "<|video_pad|>")}
CONFIG_FIELDS = {"gemma3": ("boi_token_index", "image_token_index", "eoi_token_index"),
                 "qwen2.5-vl": ("vision_start_token_id", "image_token_id", "vision_end_token_id", "video_token_id"),
                 "qwen3-vl": ("vision_start_token_id", "image_token_id", "vision_end_token_id", "video_token_id")}
# Module paths of each part in transformers 5.17's classes: the language model (its LM head, `lm_head`, lies
# outside it and is never adapted), the vision tower, and the projector (inside Qwen's tower: visual.merger;
# Qwen3-VL's deepstack mergers belong to the tower).
LANGUAGE = "model.language_model."
TOWER = {"gemma3": "model.vision_tower.", "qwen2.5-vl": "model.visual.", "qwen3-vl": "model.visual."}
PROJECTOR = {"gemma3": "model.multi_modal_projector", "qwen2.5-vl": "model.visual.merger",
             "qwen3-vl": "model.visual.merger"}
PART_SETS = [list(c) for k in (1, 2, 3) for c in itertools.combinations(("language", "vision", "projector"), k)
             if list(c) != ["projector"]]


def _marker_ids(tok, family) -> list[int]:
    ids = [tok.convert_tokens_to_ids(t) for t in MARKERS[family]]
    assert all(isinstance(i, int) and i != tok.unk_token_id for i in ids) and len(set(ids)) == len(ids)
    return ids


@pytest.mark.parametrize("family", FAMILIES)
def test_the_markers_written_here_are_the_models(tiny_vlms, family):
    """The ids written here agree with the config's fields; image_token_ids finds exactly them, on the run's
    processor and on a bare AutoProcessor (no config read: the tokenizer's and processor's names only)."""
    from transformers import AutoConfig, AutoProcessor, AutoTokenizer

    from toolbox_train.models.vision import image_token_ids

    model_dir = tiny_vlms(family)
    cfg = AutoConfig.from_pretrained(model_dir)
    ids = _marker_ids(AutoTokenizer.from_pretrained(model_dir), family)
    assert ids == [getattr(cfg, f) for f in CONFIG_FIELDS[family]]
    assert image_token_ids(load_processor(str(model_dir))) == set(ids)
    assert image_token_ids(AutoProcessor.from_pretrained(model_dir)) == set(ids)


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("train_on", ["all", "responses"])
def test_no_image_marker_carries_a_label(tmp_path, tiny_vlms, family, train_on):
    proc = load_processor(str(tiny_vlms(family)))
    batch = VisionCollator(proc, 256, train_on)(turn_rows(tmp_path))
    ids, attn = batch["input_ids"], batch["attention_mask"]
    markers = _marker_ids(proc.tokenizer, family)
    for m in markers[:3]:  # each image's start, tokens and end are in the batch (no video here)
        assert (ids == m).sum() >= 5, proc.tokenizer.convert_ids_to_tokens(m)
    want = labels_from_ids(proc.tokenizer, ids, attn, markers, train_on)
    assert (want != -100).sum() > 0
    assert torch.equal(batch["labels"], want), [proc.tokenizer.convert_ids_to_tokens(int(t)) for t in
                                                ids[(batch["labels"] != want)]]


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("train_on", ["all", "responses"])
def test_first_step_loss_is_the_reference(tmp_path, tiny_vlms, family, train_on):
    """The logged loss of step 1 (one batch of every row) equals a plain HF forward on the same rows, batched by
    the processor here and labelled from the token ids; with train_on all it differs from the forward that
    labels the image markers (the loss issue 44 measured), so this test tells the two apart."""
    from transformers import AutoModelForImageTextToText

    model_dir = tiny_vlms(family)
    data = write_image_dataset(tmp_path / "d" / "train.jsonl", n=4)
    out = tmp_path / "out"
    finetune.run(train_config(model_dir, data, out, **{"train.max_steps": 1, "train.per_device_batch_size": 4,
                                                        "data.max_seq_length": 128, "data.train_on": train_on}))
    logged = json.loads((out / "metrics.jsonl").read_text().splitlines()[0])["loss"]

    proc = load_processor(str(model_dir))
    rows = [json.loads(ln) for ln in data.read_text().splitlines()]
    texts = [proc.apply_chat_template(r["messages"], tokenize=False) for r in rows]
    imgs = [[load_image(str(data.parent / p)) for p in r["images"]] for r in rows]
    batch = proc(text=texts, images=imgs, padding=True, padding_side="right", return_tensors="pt",
                 add_special_tokens=False)
    markers = _marker_ids(proc.tokenizer, family)
    model = AutoModelForImageTextToText.from_pretrained(model_dir).eval()
    losses = {}
    for name, unlabelled in (("reference", markers), ("markers labelled", markers[1:2] + markers[3:])):
        batch["labels"] = labels_from_ids(proc.tokenizer, batch["input_ids"], batch["attention_mask"], unlabelled, train_on)
        with torch.no_grad():
            losses[name] = model(**batch).loss.item()
    print(f"{family} train_on {train_on}: step-1 loss {logged:.6f}, {losses}")
    assert logged == pytest.approx(losses["reference"], rel=1e-5)
    if train_on == "all":
        assert losses["markers labelled"] != pytest.approx(losses["reference"], rel=1e-5)


def _expected_targets(model, family, parts) -> set[str]:
    """The nn.Linear modules under the trained parts' paths (the projector's excepted: it trains whole)."""
    out = set()
    for n, m in model.named_modules():
        if not isinstance(m, torch.nn.Linear) or n.startswith(PROJECTOR[family] + "."):
            continue
        if ("language" in parts and n.startswith(LANGUAGE)) or ("vision" in parts and n.startswith(TOWER[family])):
            out.add(n)
    return out


def _resolved(tmp_path, model_dir, parts):
    data = write_image_dataset(tmp_path / "d" / "train.jsonl", n=2)
    p = finetune.resolve(train_config(model_dir, data, tmp_path / "o", method="lora",
                                      **{"lora.r": 4, "vision.train": parts, "data.max_seq_length": 128}))
    return dataclasses.replace(p, data_format="vision")  # the rows' format, as preflight reads it


@pytest.mark.parametrize("family", FAMILIES)
def test_lora_adapts_the_linear_modules_of_the_parts_named(tmp_path, tiny_vlms, family):
    """Each vision.train set (projector alone trains no adapter: refused elsewhere): the model the loader gives,
    adapted with its PEFT config as the trainer does, has LoRA on exactly the Linear modules of the parts named;
    no adapter on any other kind of module (Qwen's Conv3d patch embedding, SigLIP's Conv2d), none on the LM head;
    the projector trainable whole exactly where it is named."""
    from peft import get_peft_model
    from peft.tuners.tuners_utils import BaseTunerLayer
    from transformers import AutoModelForImageTextToText

    from toolbox_train.training import loading

    model_dir = tiny_vlms(family)
    plain = AutoModelForImageTextToText.from_pretrained(model_dir)
    assert any(isinstance(m, (torch.nn.Conv2d, torch.nn.Conv3d)) for n, m in plain.named_modules()
               if n.startswith(TOWER[family]))  # the trap: a convolution in the tower (Qwen's named `proj`)
    for i, parts in enumerate(PART_SETS):
        p = _resolved(tmp_path / str(i), model_dir, parts)
        model, _, peft_cfg = loading.load(p, finetune.Dist())
        built = get_peft_model(model, peft_cfg).base_model.model
        adapted = {n for n, m in built.named_modules() if isinstance(m, BaseTunerLayer) and hasattr(m, "lora_A")}
        assert adapted == _expected_targets(plain, family, parts), parts
        assert all(isinstance(built.get_submodule(n).get_base_layer(), torch.nn.Linear) for n in adapted)
        assert not any(n.startswith("lm_head") for n in adapted)
        whole = {n.split(".modules_to_save.")[0] for n, prm in built.named_parameters()
                 if prm.requires_grad and ".modules_to_save." in n}
        assert whole == ({PROJECTOR[family]} if "projector" in parts else set()), parts
        trainable = {n for n, prm in built.named_parameters() if prm.requires_grad}
        assert all("lora_" in n or ".modules_to_save." in n for n in trainable)


@pytest.mark.parametrize("family", FAMILIES)
def test_a_lora_run_saves_adapters_on_linear_modules_only(tmp_path, tiny_vlms, family):
    """A real run with vision.train [language, vision]: every saved lora_A is a Linear's (2-D), one per Linear
    module of the language model and the tower (before, Qwen's Conv3d patch embedding had one: [r, 3, 2, 14, 14])."""
    from transformers import AutoModelForImageTextToText

    model_dir = tiny_vlms(family)
    data = write_image_dataset(tmp_path / "d" / "train.jsonl", n=4)
    out = tmp_path / "out"
    finetune.run(train_config(model_dir, data, out, **{"method": "lora", "lora.r": 4, "train.max_steps": 1,
                                                        "data.max_seq_length": 128, "vision.train": ["language",
                                                                                                     "vision"]}))
    with safe_open(str(out / "adapter_model.safetensors"), framework="pt") as f:
        shapes = {k: f.get_slice(k).get_shape() for k in f.keys() if ".lora_A." in k}
    assert shapes and all(len(s) == 2 for s in shapes.values()), {k: s for k, s in shapes.items() if len(s) != 2}
    plain = AutoModelForImageTextToText.from_pretrained(model_dir)
    assert len(shapes) == len(_expected_targets(plain, family, ["language", "vision"]))
    assert json.loads((out / "adapter_config.json").read_text())["modules_to_save"] is None
