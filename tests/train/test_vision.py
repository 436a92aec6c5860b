"""Vision-language SFT on CPU with tiny VLMs per family: labels masked exactly (found here from the
token ids, not the way the collator finds them), the loss a plain HF forward gives, a finetune run
(full and LoRA) whose output loads as an image-text model, the parts that train, LoRA by module path."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
from safetensors import safe_open

from helpers.tiny import train_config
from helpers.tiny_vision import labels_from_ids, turn_rows, write_image_dataset
from toolbox_train.commands import finetune
from toolbox_train.data.images import load_image
from toolbox_train.models.vision import load_processor, part_of
from toolbox_train.training.vision import VisionCollator, image_token_ids

FAMILIES = ["gemma3", "qwen2.5-vl", "qwen3-vl"]
LABEL_FAMILIES = FAMILIES


@pytest.mark.parametrize("family", LABEL_FAMILIES)
@pytest.mark.parametrize("train_on", ["responses", "all"])
def test_labels_masked_exactly(tmp_path, tiny_vlms, family, train_on):
    proc = load_processor(str(tiny_vlms(family)))
    batch = VisionCollator(proc, 256, train_on)(turn_rows(tmp_path))
    image_ids = image_token_ids(proc)
    want = labels_from_ids(proc.tokenizer, batch["input_ids"], batch["attention_mask"], image_ids, train_on)
    assert torch.equal(batch["labels"], want)
    labelled = batch["labels"] != -100
    assert labelled.sum() > 0
    assert not torch.isin(batch["input_ids"][labelled], torch.tensor(sorted(image_ids))).any()
    if train_on == "responses":  # the image tokens are there, in the prompt, and unlabelled
        assert torch.isin(batch["input_ids"], torch.tensor(sorted(image_ids))).sum() > 0


@pytest.mark.parametrize("family", LABEL_FAMILIES)
def test_first_step_loss_is_a_plain_hf_forward(tmp_path, tiny_vlms, family):
    """The logged loss of step 1 equals the model's loss on the same rows, batched by the processor here and
    labelled from the token ids (the batch holds every row: the order TRL shuffles them in does not matter)."""
    from transformers import AutoModelForImageTextToText

    model_dir = tiny_vlms(family)
    data = write_image_dataset(tmp_path / "d" / "train.jsonl", n=4)
    out = tmp_path / "out"
    finetune.run(train_config(model_dir, data, out, **{"train.max_steps": 1, "train.per_device_batch_size": 4,
                                                        "data.max_seq_length": 128}))
    logged = json.loads((out / "metrics.jsonl").read_text().splitlines()[0])["loss"]

    proc = load_processor(str(model_dir))
    rows = [json.loads(ln) for ln in data.read_text().splitlines()]
    texts = [proc.apply_chat_template(r["messages"], tokenize=False) for r in rows]
    imgs = [[load_image(str(data.parent / p)) for p in r["images"]] for r in rows]
    batch = proc(text=texts, images=imgs, padding=True, return_tensors="pt", add_special_tokens=False)
    batch["labels"] = labels_from_ids(proc.tokenizer, batch["input_ids"], batch["attention_mask"], image_token_ids(proc))
    torch.manual_seed(0)
    model = AutoModelForImageTextToText.from_pretrained(model_dir).eval()
    with torch.no_grad():
        loss = model(**batch).loss.item()
    assert logged == pytest.approx(loss, rel=1e-4)


def _weights(path):
    with safe_open(str(path), framework="pt") as f:
        return {k: f.get_tensor(k) for k in f.keys()}


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("parts", [["language"], ["language", "vision", "projector"]])
def test_full_finetune_trains_the_parts_named(tmp_path, tiny_vlms, family, parts):
    from transformers import AutoModelForImageTextToText

    model_dir = tiny_vlms(family)
    data = write_image_dataset(tmp_path / "d" / "train.jsonl", n=8)
    out = tmp_path / "out"
    s = finetune.run(train_config(model_dir, data, out, **{"train.max_steps": 4, "data.max_seq_length": 128,
                                                            "vision.train": parts, "data.eval_split": 0.25,
                                                            "output.eval_steps": 4}))
    assert s["steps"] == 4 and s["last_loss"] < s["first_loss"]
    assert 0 < s["eval_loss"] < 20  # held-out image rows scored through the same collator
    before, after = _weights(model_dir / "model.safetensors"), _weights(out / "model.safetensors")
    changed = {part_of(k) for k in before if not torch.equal(before[k], after[k])}
    assert changed == set(parts)
    model = AutoModelForImageTextToText.from_pretrained(out)  # loads as an image-text model, its processor beside
    assert type(model).__name__.endswith("ForConditionalGeneration")
    assert load_processor(str(out)).image_processor is not None
    card = (out / "README.md").read_text()  # the model card says what it is
    assert "pipeline_tag: image-text-to-text" in card and f"the parts trained: {', '.join(parts)}" in card


@pytest.mark.parametrize("family", FAMILIES)
def test_lora_adapts_modules_by_path(tmp_path, tiny_vlms, family):
    from transformers import AutoModelForImageTextToText

    model_dir = tiny_vlms(family)
    data = write_image_dataset(tmp_path / "d" / "train.jsonl", n=8)
    out = tmp_path / "out"
    s = finetune.run(train_config(model_dir, data, out, **{
        "method": "lora", "lora.r": 4, "lora.alpha": 8, "train.learning_rate": 2e-2, "train.max_steps": 4,
        "data.max_seq_length": 128, "output.save": "both"}))
    assert s["last_loss"] < s["first_loss"]
    keys = list(_weights(out / "adapter_model.safetensors"))
    # The vision blocks' q_proj/gate_proj... share the language model's names: only the language model's adapted.
    assert keys and {part_of(k) for k in keys} == {"language"}
    merged = AutoModelForImageTextToText.from_pretrained(out / "merged")
    assert not any("lora_" in k for k in merged.state_dict())
    # The merged model answers an image prompt through the processor saved beside it.
    proc = load_processor(str(out / "merged"))
    row = json.loads(data.read_text().splitlines()[0])
    prompt = proc.apply_chat_template(row["messages"][:1], tokenize=False, add_generation_prompt=True)
    inputs = proc(text=[prompt], images=[[load_image(str(data.parent / row["images"][0]))]], return_tensors="pt",
                  add_special_tokens=False)
    answer = merged.generate(**inputs, max_new_tokens=4, min_new_tokens=4, do_sample=False)
    assert answer.shape[1] == inputs["input_ids"].shape[1] + 4

    out2 = tmp_path / "out2"
    finetune.run(train_config(model_dir, data, out2, **{
        "method": "lora", "lora.r": 4, "train.max_steps": 1, "data.max_seq_length": 128,
        "vision.train": ["language", "vision", "projector"]}))
    keys = list(_weights(out2 / "adapter_model.safetensors"))
    assert {part_of(k) for k in keys} == {"language", "vision", "projector"}


@pytest.mark.parametrize("family", FAMILIES)
def test_parts_and_lora_targets_by_module_path(tmp_path, family):
    """Both families' models (no processor needed): each parameter's part, and the LoRA regex adapting the
    named modules of the parts that train only, though the vision blocks reuse the language model's names."""
    import re

    from transformers import AutoModelForImageTextToText

    from helpers.tiny_vision import make_tiny_vlm
    from toolbox_train.models.vision import lora_target_regex, projector_modules

    model = AutoModelForImageTextToText.from_pretrained(make_tiny_vlm(tmp_path / family, family))
    parts = {n: part_of(n) for n, _ in model.named_parameters()}
    assert set(parts.values()) == {"language", "vision", "projector"}
    assert all(p == "language" for n, p in parts.items() if "language_model" in n or n.startswith("lm_head"))
    names = [n for n, _ in model.named_modules()]
    shared = {"q_proj", "gate_proj"} & {n.rsplit(".", 1)[-1] for n in names if part_of(n) == "vision"}
    assert shared or family == "qwen3-vl"  # the trap: a vision block with a language model's module name (Qwen3-VL's
    # blocks name theirs qkv, proj, linear_fc1/2)
    for train in (["language"], ["vision"], ["language", "vision"]):
        rx = lora_target_regex(train, "all-linear")
        hit = {part_of(n) for n in names if re.fullmatch(rx, n)}
        assert hit == set(train)
        if "vision" in train:  # every linear module of the vision blocks, attention and MLP
            block = [n for n, m in model.named_modules() if part_of(n) == "vision" and ".blocks." in n.replace(
                ".layers.", ".blocks.") and isinstance(m, torch.nn.Linear)]
            assert block and all(re.fullmatch(rx, n) for n in block), [n for n in block if not re.fullmatch(rx, n)]
        named = [n for n in names if re.fullmatch(lora_target_regex(train, ["q_proj"]), n)]
        assert all(n.endswith(".q_proj") and part_of(n) in train for n in named)
        assert named or "language" not in train
    assert [n for n in names if n.endswith(projector_modules()) and part_of(n) == "projector"]


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("method", ["lora", "full"])
def test_stopped_and_resumed_equals_uninterrupted(tmp_path, tiny_vlms, monkeypatch, family, method):
    model_dir = tiny_vlms(family)
    data = write_image_dataset(tmp_path / "d" / "train.jsonl", n=12)

    def cfg(out):
        return train_config(model_dir, data, out, **{
            "method": method, "lora.r": 4, "lora.dropout": 0.2, "train.max_steps": 5, "train.per_device_batch_size": 3,
            "output.save_steps": 2, "train.lr_scheduler": "cosine", "data.max_seq_length": 128,
            "vision.train": ["language", "projector"]})

    finetune.run(cfg(tmp_path / "ref"))
    monkeypatch.setenv("TOOLBOX_STOP_AFTER_STEP", "2")
    assert finetune.run(cfg(tmp_path / "cut"))["steps"] == 2
    monkeypatch.delenv("TOOLBOX_STOP_AFTER_STEP")
    assert finetune.run(cfg(tmp_path / "cut"), resume=True)["steps"] == 5
    name = "adapter_model.safetensors" if method == "lora" else "model.safetensors"
    a, b = _weights(tmp_path / "ref" / name), _weights(tmp_path / "cut" / name)
    assert a.keys() == b.keys() and a
    assert max((a[k] - b[k]).abs().max().item() for k in a) <= 1e-6
    losses = [[json.loads(x)["loss"] for x in (tmp_path / d / "metrics.jsonl").read_text().splitlines()]
              for d in ("ref", "cut")]
    assert len(losses[1]) == 5 and losses[1] == pytest.approx(losses[0], abs=1e-5)


@pytest.mark.parametrize("family, tokens", [("gemma3", "4 tokens per image (28x28 pixels)"),
                                            ("qwen2.5-vl", "4-16384 tokens per image by its resolution"),
                                            ("qwen3-vl", "4-16384 tokens per image by its resolution")])
def test_plan_shows_image_tokens_and_the_tower(tmp_path, capsys, family, tokens):
    import yaml

    from helpers.tiny_vision import make_tiny_vlm, require_torchvision

    if family != "gemma3":
        require_torchvision()
    model_dir = make_tiny_vlm(tmp_path / family, family)
    if family != "gemma3":  # the real model's pixel range, as transformers 5.17 saves it (the tiny one's: 28x28)
        doc = json.loads((model_dir / "processor_config.json").read_text())
        doc["image_processor"]["size"] = {"shortest_edge": 3136, "longest_edge": 12845056}
        (model_dir / "processor_config.json").write_text(json.dumps(doc))
    data = write_image_dataset(tmp_path / "d" / "train.jsonl", n=2)
    cfg = tmp_path / "t.yaml"
    cfg.write_text(yaml.safe_dump(train_config(model_dir, data, tmp_path / "out", **{"vision.train": ["language", "vision"]})))
    assert finetune.main(["--config", str(cfg), "--plan"]) == 0
    out = capsys.readouterr().out
    line = next(ln for ln in out.splitlines() if ln.startswith("vision-language model"))
    assert tokens in line and "vision.train: language, vision" in line
    assert "gradients and optimizer state counted, and the tower's activations at" in line, line
    tower = int(line.split("vision tower and projector ")[1].split(" parameters")[0].replace(",", ""))
    from transformers import AutoModelForImageTextToText

    real = sum(prm.numel() for n, prm in AutoModelForImageTextToText.from_pretrained(model_dir).named_parameters()
               if part_of(n) != "language")
    # every parameter: Qwen-VL's `depth` blocks, gated MLP and patch merger; SigLIP's pooling head, which the
    # tiny config builds (vision_use_head unset) and Gemma 3's real configs turn off (models/tower.py)
    assert tower == real
    assert not (tmp_path / "out").exists()


def test_image_and_text_sources_mix(tmp_path, tiny_vlms):
    """A mixture of image rows, text conversations and alpaca rows trains as image rows; a batch holding an
    image row and a text row is labelled exactly."""
    from helpers.tiny import write_dataset
    from toolbox_train.data.dataset import load_datasets
    from toolbox_train.config.schema import TrainConfig

    model_dir = tiny_vlms("gemma3")
    srcs = [write_image_dataset(tmp_path / "img" / "train.jsonl", n=6), write_dataset(tmp_path / "chat.jsonl",
            "messages", n=6), write_dataset(tmp_path / "alpaca.jsonl", "alpaca", n=6)]
    cfg = train_config(model_dir, srcs[0], tmp_path / "out", **{"train.max_steps": 2, "data.max_seq_length": 128})
    cfg["data"] = {"sources": [{"path": str(s)} for s in srcs], "max_seq_length": 128}
    train, _, fmt = load_datasets(TrainConfig.model_validate(cfg), tmp_path)
    assert fmt == "vision" and len(train) == 18
    rows = [train[0], train[6], train[12]]
    assert [len(r["images"]) for r in rows] == [1, 0, 0]
    proc = load_processor(str(model_dir))
    batch = VisionCollator(proc, 256)(rows)
    assert torch.equal(batch["labels"], labels_from_ids(proc.tokenizer, batch["input_ids"], batch["attention_mask"],
                                                  image_token_ids(proc)))
    assert batch["pixel_values"].shape[0] == 1
    assert finetune.run(cfg)["steps"] == 2


@pytest.mark.parametrize("parts", [["language"], ["language", "vision"]])
def test_unsloth_vision_calls(tmp_path, tiny_vlms, monkeypatch, parts):
    """Backend unsloth on image rows: FastVisionModel, called with the keyword names of Unsloth's real
    from_pretrained / get_peft_model (a stand-in module: Unsloth raises on import without a GPU)."""
    import importlib.machinery
    import sys
    import types

    from train.test_unsloth_calls import FROM_PRETRAINED, GET_PEFT
    from toolbox_train.training import loading

    calls = []

    class FastVisionModel:
        @staticmethod
        def from_pretrained(**kw):
            assert set(kw) <= FROM_PRETRAINED, set(kw) - FROM_PRETRAINED
            calls.append(("from_pretrained", kw))
            from transformers import AutoModelForImageTextToText

            return AutoModelForImageTextToText.from_pretrained(kw["model_name"]), load_processor(kw["model_name"])

        @staticmethod
        def get_peft_model(model, **kw):
            assert set(kw) <= GET_PEFT, set(kw) - GET_PEFT
            calls.append(("get_peft_model", kw))
            return model

    mod = types.ModuleType("unsloth")
    mod.__spec__ = importlib.machinery.ModuleSpec("unsloth", None)
    mod.FastVisionModel = FastVisionModel
    monkeypatch.setitem(sys.modules, "unsloth", mod)
    data = write_image_dataset(tmp_path / "d" / "train.jsonl", n=2)
    p = finetune.resolve(train_config(tiny_vlms("gemma3"), data, tmp_path / "o", method="lora",
                                      **{"lora.r": 4, "vision.train": parts}))
    # what the run resolves to on a GPU with unsloth installed, its image rows read by preflight
    p = dataclasses.replace(p, backend="unsloth", precision="bf16", data_format="vision")
    model, proc, peft_cfg = loading.load(p, finetune.Dist())
    assert peft_cfg is None and proc.image_processor is not None
    (f1, kw1), (f2, kw2) = calls
    assert (f1, f2) == ("from_pretrained", "get_peft_model")
    assert kw1["load_in_16bit"] is True and kw1["full_finetuning"] is False
    assert kw2["finetune_vision_layers"] is ("vision" in parts) and kw2["finetune_language_layers"] is True
