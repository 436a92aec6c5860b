"""The model-family table (models/families.py, issue 45): no other module of the training package names a
family, and a family added as one entry is all the vision, tower and plan code need."""

from __future__ import annotations

import ast
import dataclasses
import re
from pathlib import Path

import pytest

from toolbox_train.models import families as F

ROOT = Path(__file__).resolve().parents[2] / "entrypoints" / "toolbox_train"
# Modules whose strings may hold a model_type, each for its reason: they are a model's config.json, not what
# the toolbox knows of a family (the table says that).
EXCEPTIONS = {
    "models/families.py": "the table itself",
    "bench/shapes.py": "the benchmark shapes' config.json (model_type and sizes of Llama, Qwen3, Gemma 3, GPT-OSS)",
    "planning/memory.py": "`--plan --model NAME`'s config.json of named models (gemma-3-4b, qwen3-8b, gpt-oss-20b)",
}


def _names() -> list[str]:
    """Every model_type, tower kind and tower config type the table knows, longest first."""
    return sorted({*F.FAMILIES, *(t.name for t in F.TOWERS), *(v for t in F.TOWERS for v in t.vision_types)},
                  key=len, reverse=True)


def _strings(path: Path):
    """(line, text) of each string constant of a module that is not a docstring (comments are no strings)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    docs = {id(n.body[0].value) for n in ast.walk(tree)
            if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and n.body
            and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
    for n in ast.walk(tree):
        if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docs:
            yield n.lineno, n.value


def _family_strings() -> dict[str, list[str]]:
    """Module -> its strings naming a model_type as one (gemma3, gemma3_text, "siglip"), not a model's name
    (qwen3-0.6b, tiny-gemma3: a benchmark shape's, a message's)."""
    rx = re.compile(r"(?<![A-Za-z0-9_-])(" + "|".join(map(re.escape, _names())) + r")(?![A-Za-z0-9-])")
    hits: dict[str, list[str]] = {}
    for f in sorted(ROOT.rglob("*.py")):
        for line, text in _strings(f):
            if rx.search(text):
                hits.setdefault(f.relative_to(ROOT).as_posix(), []).append(f"{line}: {text[:60]!r}")
    return hits


def test_no_module_outside_the_table_names_a_family():
    hits = _family_strings()
    outside = {m: h for m, h in hits.items() if m not in EXCEPTIONS}
    assert not outside, f"family names outside models/families.py (read the table instead): {outside}"
    assert set(EXCEPTIONS) <= set(hits), f"exceptions no module needs any more: {set(EXCEPTIONS) - set(hits)}"


def test_the_scan_finds_a_family_named_in_code(tmp_path):
    """The scan above fails where it should: a comparison against a model_type, not a model's name."""
    f = tmp_path / "m.py"
    f.write_text('"""Doc: gemma3 is fine here."""\nX = "qwen3-0.6b"  # gpt_oss in a comment\n'
                 'def f(mt):\n    return mt.startswith("gemma3")\n')
    rx = re.compile(r"(?<![A-Za-z0-9_-])(" + "|".join(map(re.escape, _names())) + r")(?![A-Za-z0-9-])")
    assert [t for _, t in _strings(f) if rx.search(t)] == ["gemma3"]


@pytest.mark.parametrize("mt, want", [
    ("gemma3_text", "Gemma 3"), ("gemma3n_text", "Gemma 3"), ("gemma2", "Gemma 2"), ("qwen3_moe", "Qwen3"),
    ("qwen3_vl_text", "Qwen3-VL"), ("qwen2_5_vl", "Qwen2.5-VL"), ("gpt_oss", "GPT-OSS"), ("llama", ""), (None, ""),
])
def test_a_key_covers_its_variants(mt, want):
    assert F.family(mt).name == want


def _qwen25_vl(depth: int = 2):
    import transformers as tf

    text = dict(vocab_size=100, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4,
                num_key_value_heads=2, head_dim=8,
                rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [1, 1, 2]})
    cfg = tf.Qwen2_5_VLConfig(text_config=text, vision_config=dict(
        depth=depth, hidden_size=64, intermediate_size=128, num_heads=4, out_hidden_size=32, patch_size=14,
        spatial_merge_size=2, temporal_patch_size=2, window_size=112, fullatt_block_indexes=[depth - 1]))
    return cfg, tf.Qwen2_5_VLForConditionalGeneration(cfg)


def test_a_family_added_as_one_entry(monkeypatch):
    """A made-up family, Qwen2.5-VL's entry under model_type `toy_vl` with its tower at `eyes` (the merger at
    `eyes.merger`) and a tower config type no table knows: one entry, and the parts, the LoRA targets, the
    trainable parameters and the memory plan of a tiny model of it come out as Qwen2.5-VL's do."""
    import torch

    from toolbox_train.models import arithmetic as M, vision

    cfg, model = _qwen25_vl()
    want = {n: vision.part_of(n) for n, _ in model.named_parameters()}
    eyes = model.model.visual  # the tiny model of `toy_vl`: its tower at another path
    del model.model.visual
    model.model.eyes = eyes
    doc = cfg.to_dict()
    doc.update(model_type="toy_vl", vision_config={**doc["vision_config"], "model_type": "toy_vl_vision"})
    vision_param = "model.eyes.blocks.0.mlp.gate_proj.weight"
    assert vision.part_of(vision_param) == "language"  # not in the table: the toy's tower is the language model's

    toy = dataclasses.replace(F.FAMILIES["qwen2_5_vl"], name="Toy-VL", tower_paths=("eyes",),
                              projector_paths=("eyes.merger",))
    monkeypatch.setitem(F.FAMILIES, "toy_vl", toy)
    assert F.family("toy_vl") is toy and F.family("toy_vl_text") is toy

    got = {n.replace(".eyes.", ".visual."): vision.part_of(n) for n, _ in model.named_parameters()}
    assert got == want and got[vision_param.replace("eyes", "visual")] == "vision"
    names = vision.lora_target_names(model, ["vision"], "all-linear")
    assert names and all(n.startswith("model.eyes.blocks.") for n in names)
    assert all(isinstance(model.get_submodule(n), torch.nn.Linear) for n in names)
    assert not [n for n in vision.lora_target_names(model, ["language"], "all-linear") if ".eyes." in n]
    assert "eyes.merger" in vision.projector_modules()
    counts = vision.set_trainable(model, ["projector"])
    assert counts["vision"] == 0 and counts["projector"] == sum(
        p.numel() for n, p in model.named_parameters() if ".eyes.merger." in n)

    shape = M.Shape.from_config(doc)  # the plan: the tower kind from the entry, its parameters the model's
    assert shape.tower.kind == F.QWEN25_VL.name
    by_part = {"vision": 0, "projector": 0}
    for n, p in model.named_parameters():
        if vision.part_of(n) in by_part:
            by_part[vision.part_of(n)] += p.numel()
    assert (shape.tower.params, shape.tower.projector) == (by_part["vision"], by_part["projector"])
    plan = M.estimate(shape, M.Setting(method="full", batch=1, seq=64, vision_train=("vision",), patches_per_row=64))
    assert plan.parts["vision_tower_activations"] == shape.tower.activation_bytes(64, 2, True)


@pytest.mark.parametrize("to, tail", [("gguf", "; --quant mxfp4_moe re-quantizes them for llama.cpp"), ("merged", "")])
def test_export_notes_come_from_the_table(tmp_path, to, tail):
    from toolbox_train.runs.folder import RunModel

    def notes(mt):
        return RunModel(tmp_path, "full", "full", None, mt, False, {}).export_notes(to)

    assert notes("gpt_oss") == ["GPT-OSS: experts are exported de-quantized (16-bit), not in the original MXFP4" + tail]
    assert notes("llama") == notes("?") == []
