"""The model card (README.md) beside a run's adapter, its merged copy and an `export-model` output:
front matter the Hub's parser reads, and the run's own values in it."""

from __future__ import annotations

import json
import shutil

import pytest
import yaml

from exportkit import finetune_run
from toolbox_train.export import card
from toolbox_train.export import model as export


@pytest.fixture(scope="module")
def hub_base(tiny_model, tmp_path_factory):
    """The tiny model laid out as a Hub cache snapshot of `acme/tiny-base`, its card naming a license."""
    d = tmp_path_factory.mktemp("hub") / "models--acme--tiny-base" / "snapshots" / "0123abc"
    shutil.copytree(tiny_model, d)
    (d / "README.md").write_text("---\nlicense: other\nlicense_name: tiny-license\nlicense_link: LICENSE\n"
                                 "---\n# tiny\n")
    return d


@pytest.fixture(scope="module")
def run(hub_base, tmp_path_factory):
    return finetune_run(hub_base, tmp_path_factory.mktemp("card") / "my-run", steps=3, **{
        "lora.target_modules": ["q_proj", "v_proj"], "lora.dropout": 0.05, "output.save": "both",
        "data.eval_split": 0.25})


def _load(path):
    from huggingface_hub import ModelCard

    return ModelCard.load(path)  # the Hub's parser: raises on front matter it cannot read


def _summary(run):
    return json.loads((run / "summary.json").read_text())


def test_run_folder_card_has_the_runs_values(run):
    c = _load(run / "README.md")
    s = _summary(run)
    d = c.data
    assert d.base_model == "acme/tiny-base" and d.base_model_relation == "adapter"
    assert d.license == "other" and d.license_name == "tiny-license" and d.license_link == "LICENSE"
    assert d.library_name == "peft" and {"lora", "sft", "trl", "toolbox"} <= set(d.tags)
    text = c.text
    assert "LoRA: r 4, alpha 8, dropout 0.05, target modules q_proj, v_proj" in text
    assert "| learning rate | 0.02 |" in text and "| max steps | 3 |" in text
    assert f"| final loss | {s['last_loss']:.4g} |" in text and f"| eval loss | {s['eval_loss']:.4g} |" in text
    assert f"| steps | {s['steps']} |" in text
    assert "my-run-data.jsonl (local file)" in text and str(run.parent) not in text  # no machine paths
    merged = _load(run / "merged" / "README.md").data
    assert merged.library_name == "transformers" and merged.base_model_relation == "finetune"


def test_merged_export_writes_a_card(run, tmp_path):
    out = tmp_path / "merged"
    assert export.main(["--run", str(run), "--to", "merged", "--out", str(out)]) == 0
    c = _load(out / "README.md")
    assert c.data.library_name == "transformers" and c.data.base_model == "acme/tiny-base"
    assert "16-bit safetensors" in c.text
    assert f"| final loss | {_summary(run)['last_loss']:.4g} |" in c.text
    assert "README.md" in {f["path"] for f in json.loads((out / "export.json").read_text())["files"]}


def test_full_run_and_license_from_config(tiny_model, tmp_path):
    base = tmp_path / "base"
    shutil.copytree(tiny_model, base)
    cfg = json.loads((base / "config.json").read_text())
    (base / "config.json").write_text(json.dumps({**cfg, "license": "mit"}))
    run = finetune_run(base, tmp_path / "full", method="full", steps=2)
    d = _load(run / "README.md").data
    assert d.license == "mit" and d.library_name == "transformers" and "full" in d.tags
    assert d.base_model is None  # a local folder: no Hub id to name
    assert "LoRA:" not in _load(run / "README.md").text


def test_gguf_card_names_the_files(run):
    resolved = yaml.safe_load((run / "config.resolved.yaml").read_text())
    resolved["data"]["path"] = "acme/chat-data"  # a Hub dataset: named in the front matter
    text = card.card_text(resolved, _summary(run), "gguf", ["model-f16.gguf", "model-q4_k_m.gguf"])
    c = _load_text(text)
    assert "gguf" in c.data.tags and c.data.library_name is None and c.data.datasets == ["acme/chat-data"]
    assert "- acme/chat-data" in c.text
    assert "model-f16.gguf, model-q4_k_m.gguf" in c.text


def _load_text(text):
    from huggingface_hub import ModelCard

    return ModelCard(text)
