"""Issue 26's mixture-of-experts bench shape (GPT-OSS-20B cut to 4 layers) and its MoE-aware FLOPs."""

from __future__ import annotations

import pytest

from toolbox_train import bench
from toolbox_train.bench.measure import attn_implementation
from toolbox_train.bench.shapes import layer_types
from toolbox_train.planning.memory import PUBLIC_SHAPES


def test_gpt_oss_shape_is_the_20b_config_cut_to_4_layers():
    cfg, real = bench.SHAPES["gpt-oss-20b-4l"], PUBLIC_SHAPES["gpt-oss-20b"]
    for k in ("model_type", "hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads",
              "head_dim", "vocab_size", "num_local_experts", "num_experts_per_tok", "sliding_window",
              "attention_bias", "tie_word_embeddings"):
        assert cfg[k] == real[k], k
    assert (cfg["num_hidden_layers"], real["num_hidden_layers"]) == (4, 24)
    assert layer_types(cfg) == ["sliding_attention", "full_attention"] * 2
    # transformers' GPT-OSS has no SDPA path: bench's HF loops take transformers' default, as finetune does
    assert attn_implementation("gpt-oss-20b-4l") == {} and attn_implementation("llama-1b") == {
        "attn_implementation": "sdpa"}


def test_moe_flops_count_the_active_experts_only():
    cfg = bench.SHAPES["gpt-oss-20b-4l"]
    h, L, V = 2880, 4, 201088
    attn = h * 64 * 64 + 2 * h * 8 * 64 + 64 * 64 * h
    expert = 3 * h * 2880  # gate_up_proj (h x 2i) + down_proj (i x h)
    active = L * (attn + 4 * expert + h * 32) + h * V  # 4 of 32 experts, the router, the LM head
    assert bench.matmul_params(cfg) == active == 1_083_801_600
    dense = dict(cfg, num_experts_per_tok=32)  # every expert counted: what a dense formula would say
    assert bench.matmul_params(dense) - active == L * 28 * expert
    spans = 2 * 128 + 2 * 1024  # sliding layers attend to 128 positions at most
    assert bench.flops_per_token(cfg, 1024, "lora") == pytest.approx(4 * active + 12 * 64 * 64 * spans)
    assert bench.flops_per_token(cfg, 1024, "full") == pytest.approx(6 * active + 12 * 64 * 64 * spans)
    peak = bench.peak_flops("NVIDIA H100 80GB HBM3")
    assert bench.mfu(20_000, "gpt-oss-20b-4l", 1024, "lora", peak) == pytest.approx(
        20_000 * (4 * active + 12 * 64 * 64 * spans) / 989.4e12)


def test_tiny_gpt_oss_matmul_params_match_the_built_model(tmp_path):
    import torch
    from transformers import AutoModelForCausalLM

    shape = bench.SHAPES["tiny-gpt-oss"]
    model = AutoModelForCausalLM.from_pretrained(bench.build_model_dir("tiny-gpt-oss", tmp_path / "m"))
    assert model.config.model_type == "gpt_oss"
    linear = sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))  # attention, head
    k, e = shape["num_experts_per_tok"], shape["num_local_experts"]
    experts = sum(m.gate_up_proj.numel() + m.down_proj.numel() for n, m in model.named_modules()
                  if n.endswith("mlp.experts"))
    routers = sum(m.weight.numel() for n, m in model.named_modules() if n.endswith("mlp.router"))
    assert experts and routers and not isinstance(model.model.layers[0].mlp.experts.gate_up_proj, torch.nn.Linear)
    assert bench.matmul_params(shape) == linear + routers + experts * k // e


def test_gpt_oss_row_ids():
    for kind, backend in (("bare", "unsloth"), ("finetune", "unsloth"), ("bare", "hf"), ("finetune", "hf")):
        assert bench.Row(kind, backend, "lora", "gpt-oss-20b-4l").id == f"gpt-oss-20b-4l/{kind}-{backend}-lora"
    assert [r.id for r in bench.select_rows(bench.build_matrix(["gpt-oss-20b-4l"]), ["*/bare-hf-lora+*"])] == [
        "gpt-oss-20b-4l/bare-hf-lora+ckpt", "gpt-oss-20b-4l/bare-hf-lora+ckpt+liger"]


def test_bare_hf_lora_adapts_what_finetunes_hf_lora_adapts(tmp_path):
    """The bare HF loop and finetune's HF path train the same adapters: on GPT-OSS the experts too."""
    import yaml
    from peft import get_peft_model
    from transformers import AutoModelForCausalLM

    from toolbox_train.bench.measure import lora_config
    from toolbox_train.bench.shapes import LORA_TARGETS
    from toolbox_train.commands import finetune
    from toolbox_train.models.lora import peft_config

    assert not getattr(lora_config("tiny-llama"), "target_parameters", None)
    model_dir = bench.build_model_dir("tiny-gpt-oss", tmp_path / "m")
    (tmp_path / "d.jsonl").write_text('{"text": "a b c"}\n')
    cfg = {"model": {"path": str(model_dir)}, "method": "lora", "data": {"path": str(tmp_path / "d.jsonl")},
           "lora": {"r": 16, "alpha": 16, "dropout": 0.0, "target_modules": list(LORA_TARGETS)},
           "output": {"dir": str(tmp_path / "o")}}
    (tmp_path / "t.yaml").write_text(yaml.safe_dump(cfg))
    ours = peft_config(finetune.resolve(str(tmp_path / "t.yaml")))
    counts = [get_peft_model(AutoModelForCausalLM.from_pretrained(model_dir), c).get_nb_trainable_parameters()[0]
              for c in (lora_config("tiny-gpt-oss"), ours)]
    assert sorted(lora_config("tiny-gpt-oss").target_parameters) == sorted(ours.target_parameters)
    assert counts[0] == counts[1]
