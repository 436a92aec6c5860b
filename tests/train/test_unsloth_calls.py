"""The Unsloth path, checked against Unsloth's API without a GPU.

Unsloth raises on import without a GPU, so a stand-in module records the calls. Its functions
accept only the keyword names of Unsloth's real `from_pretrained`/`get_peft_model` (2026.x), so a
misspelt or removed argument fails here; the model it returns is the real HF model.
"""

from __future__ import annotations

import dataclasses
import importlib.machinery
import sys
import types

import pytest

from helpers.tiny import train_config, write_dataset
from toolbox_train.commands import finetune
from toolbox_train.training import loading as models

FROM_PRETRAINED = {"model_name", "max_seq_length", "dtype", "load_in_4bit", "load_in_8bit", "load_in_16bit",
                   "full_finetuning", "token", "device_map", "rope_scaling", "fix_tokenizer", "trust_remote_code",
                   "use_gradient_checkpointing", "resize_model_vocab", "revision"}
GET_PEFT = {"r", "target_modules", "lora_alpha", "lora_dropout", "bias", "use_gradient_checkpointing",
            "random_state", "use_rslora", "loftq_config", "finetune_vision_layers", "finetune_language_layers",
            "finetune_attention_modules", "finetune_mlp_modules"}


@pytest.fixture
def fake_unsloth(monkeypatch):
    calls = []

    def loader(name, vision):
        class Fast:
            @staticmethod
            def from_pretrained(**kw):
                assert set(kw) <= FROM_PRETRAINED, set(kw) - FROM_PRETRAINED
                calls.append((name, "from_pretrained", kw))
                from transformers import AutoModelForCausalLM, AutoTokenizer

                return AutoModelForCausalLM.from_pretrained(kw["model_name"]), AutoTokenizer.from_pretrained(
                    kw["model_name"])

            @staticmethod
            def get_peft_model(model, **kw):
                allowed = GET_PEFT if vision else GET_PEFT - {"finetune_vision_layers", "finetune_language_layers",
                                                              "finetune_attention_modules", "finetune_mlp_modules"}
                assert set(kw) <= allowed, set(kw) - allowed
                calls.append((name, "get_peft_model", kw))
                from peft import LoraConfig, get_peft_model

                return get_peft_model(model, LoraConfig(r=kw["r"], lora_alpha=kw["lora_alpha"],
                                                        target_modules=kw.get("target_modules", "all-linear")))
        return Fast

    mod = types.ModuleType("unsloth")
    mod.__spec__ = importlib.machinery.ModuleSpec("unsloth", None)
    mod.FastLanguageModel = loader("FastLanguageModel", False)
    mod.FastModel = loader("FastModel", True)
    monkeypatch.setitem(sys.modules, "unsloth", mod)
    return calls


def _plan(tmp_path, model, method):
    data = write_dataset(tmp_path / "d.jsonl")
    p = finetune.resolve(train_config(model, data, tmp_path / "o", method=method,
                                   **{"lora.r": 4, "train.gradient_checkpointing": True}))
    # what the run resolves to on a GPU with unsloth installed
    return dataclasses.replace(p, backend="unsloth", precision="bf16")


@pytest.mark.parametrize("arch,loader", [("llama", "FastLanguageModel"), ("qwen3", "FastLanguageModel"),
                                         ("gemma3", "FastModel"), ("gemma3-mm", "FastModel")])
def test_lora_calls(tmp_path, tiny_models, fake_unsloth, arch, loader):
    p = _plan(tmp_path, tiny_models(arch), "lora")
    model, tok, peft_cfg = models.load_unsloth(p, finetune.Dist(world_size=2, rank=1, local_rank=1))
    assert peft_cfg is None and tok is not None
    (n1, f1, kw1), (n2, f2, kw2) = fake_unsloth
    assert (n1, f1, n2, f2) == (loader, "from_pretrained", loader, "get_peft_model")
    assert kw1["device_map"] == {"": 1}  # each DDP rank on its own GPU
    assert kw1["load_in_4bit"] is False and kw1["load_in_16bit"] is True and kw1["full_finetuning"] is False
    assert kw1["use_gradient_checkpointing"] == "unsloth"
    assert kw2["r"] == 4 and kw2["use_gradient_checkpointing"] == "unsloth" and kw2["random_state"] == 0
    if loader == "FastModel":
        assert kw2["finetune_vision_layers"] is False and kw2["finetune_language_layers"] is True
    else:
        assert kw2["target_modules"] == ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


@pytest.mark.parametrize("method,four,eight,full", [("full", False, False, True), ("qlora", True, False, False)])
def test_full_and_qlora_calls(tmp_path, tiny_model, fake_unsloth, method, four, eight, full):
    p = _plan(tmp_path, tiny_model, "full")
    p = dataclasses.replace(p, cfg=p.cfg.model_copy(update={"method": method}))
    models.load_unsloth(p, finetune.Dist())
    kw = fake_unsloth[0][2]
    assert (kw["load_in_4bit"], kw["load_in_8bit"], kw["full_finetuning"]) == (four, eight, full)
    assert kw["device_map"] == "sequential"
    assert len(fake_unsloth) == (1 if method == "full" else 2)


def test_grpo_sizes_the_model_for_prompt_and_completion(tmp_path, tiny_model, fake_unsloth):
    """GRPO scores prompt + completion: Unsloth's max_seq_length at the prompt's limit alone cut the
    sequences and stopped at step 1 on an H100 (docs/bench/2026-12-06-h100/grpo-unsloth). The run resolves
    the length once (seq_tokens: the GRPO unit's extra_tokens on top of data.max_seq_length)."""
    p = _plan(tmp_path, tiny_model, "lora")
    assert fake_unsloth == [] and p.cfg.objective == "sft"
    models.load_unsloth(p, finetune.Dist())
    assert fake_unsloth[0][2]["max_seq_length"] == p.cfg.data.max_seq_length
    fake_unsloth.clear()
    data = write_dataset(tmp_path / "d.jsonl")
    g = finetune.resolve(train_config(tiny_model, data, tmp_path / "g", method="lora", objective="grpo",
                                      **{"lora.r": 4, "grpo.max_completion_length": 24}))
    models.load_unsloth(dataclasses.replace(g, backend="unsloth", precision="bf16"), finetune.Dist())
    assert fake_unsloth[0][2]["max_seq_length"] == g.cfg.data.max_seq_length + 24
