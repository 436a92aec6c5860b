"""Model shapes (the configs of public models; weights are random) and their FLOPs per token (MFU)."""

from __future__ import annotations

from typing import Any

from toolbox_train.contract import UserError
from toolbox_train.models.arithmetic import moe_experts
from toolbox_train.models.families import family

SHAPES: dict[str, dict[str, Any]] = {
    "llama-1b": dict(  # Llama-3.2-1B
        model_type="llama", hidden_size=2048, num_hidden_layers=16, num_attention_heads=32,
        num_key_value_heads=8, head_dim=64, intermediate_size=8192, vocab_size=128256,
        tie_word_embeddings=True, max_position_embeddings=131072, rope_theta=500000.0,
    ),
    "qwen3-0.6b": dict(  # Qwen3-0.6B
        model_type="qwen3", hidden_size=1024, num_hidden_layers=28, num_attention_heads=16,
        num_key_value_heads=8, head_dim=128, intermediate_size=3072, vocab_size=151936,
        tie_word_embeddings=True, max_position_embeddings=40960, rope_theta=1000000.0,
    ),
    "gemma3-1b": dict(  # Gemma-3-1B (text)
        model_type="gemma3_text", hidden_size=1152, num_hidden_layers=26, num_attention_heads=4,
        num_key_value_heads=1, head_dim=256, intermediate_size=6912, vocab_size=262144,
        tie_word_embeddings=True, max_position_embeddings=32768, sliding_window=512,
        query_pre_attn_scalar=256,
    ),
    # GPT-OSS-20B (openai/gpt-oss-20b's config.json) cut from 24 layers to 4, so that it builds in a minute:
    # 32 experts of which 4 run per token, alternating sliding (128) / full attention layers, untied
    # 201088 x 2880 embedding and head (0.58B parameters each), 4.45B parameters in all (8.3 GiB in bf16), 1.08B
    # of them in a token's matrix products (matmul_params). Random bf16 weights: no MXFP4 experts, no quantization.
    "gpt-oss-20b-4l": dict(
        model_type="gpt_oss", hidden_size=2880, num_hidden_layers=4, num_attention_heads=64,
        num_key_value_heads=8, head_dim=64, intermediate_size=2880, vocab_size=201088,
        num_local_experts=32, num_experts_per_tok=4, sliding_window=128, attention_bias=True,
        tie_word_embeddings=False, max_position_embeddings=131072,
        rope_parameters={"rope_type": "yarn", "rope_theta": 150000.0, "factor": 32.0, "beta_fast": 32.0,
                         "beta_slow": 1.0, "truncate": False, "original_max_position_embeddings": 4096},
    ),
    # CPU test shapes: same architectures, a few MB
    "tiny-llama": dict(
        model_type="llama", hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, intermediate_size=128, vocab_size=512,
        tie_word_embeddings=True, max_position_embeddings=4096,
    ),
    "tiny-qwen3": dict(
        model_type="qwen3", hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, intermediate_size=128, vocab_size=512,
        tie_word_embeddings=True, max_position_embeddings=4096,
    ),
    "tiny-gemma3": dict(
        model_type="gemma3_text", hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=1, head_dim=16, intermediate_size=128, vocab_size=512,
        tie_word_embeddings=True, max_position_embeddings=4096, sliding_window=64,
        query_pre_attn_scalar=16,
    ),
    "tiny-gpt-oss": dict(
        model_type="gpt_oss", hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, intermediate_size=64, vocab_size=512,
        num_local_experts=8, num_experts_per_tok=2, sliding_window=64, attention_bias=True,
        tie_word_embeddings=False, max_position_embeddings=4096,
    ),
}

# Dense bf16 tensor-core peak (datasheet, no sparsity), matched against the device name.
PEAK_BF16_FLOPS = [
    ("H200", 989.4e12), ("H100 PCIe", 756.0e12), ("H100", 989.4e12), ("H800", 989.4e12),
    ("GH200", 989.4e12), ("A100", 312.0e12), ("L40S", 362.1e12), ("MI300X", 1307.4e12),
]

SPECIAL_TOKENS = ["<unk>", "<s>", "</s>", "<pad>"]
LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


class BenchError(UserError):
    """Bad input to the harness (exit 2)."""


# FLOPs and MFU


def _shape_cfg(shape_or_cfg: str | dict) -> dict:
    return SHAPES[shape_or_cfg] if isinstance(shape_or_cfg, str) else shape_or_cfg


def matmul_params(cfg: dict) -> int:
    """Weights that take part in matrix products per token (all linear layers + LM head).

    Mixture of experts: a token goes through the router and its `num_experts_per_tok` experts only, so
    only those count (GPT-OSS-20B: 4 of 32), not the parameters the model holds.
    """
    h, L = cfg["hidden_size"], cfg["num_hidden_layers"]
    nh, nkv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    hd = cfg.get("head_dim") or h // nh
    attn = h * nh * hd + 2 * h * nkv * hd + nh * hd * h
    mlp = 3 * h * cfg["intermediate_size"]  # gate, up, down (an expert's gate_up_proj is gate and up)
    experts = moe_experts(cfg)
    if experts:
        mlp = cfg["num_experts_per_tok"] * mlp + h * experts  # the active experts + the router
    return L * (attn + mlp) + h * cfg["vocab_size"]


def flops_per_token(shape_or_cfg: str | dict, seq: int, method: str = "full") -> float:
    """Model FLOPs per trained token, forward + backward, recomputation not counted.

    PaLM's convention (appendix B): 6N for the weights plus 12*L*heads*head_dim*seq for attention
    (causal masking not subtracted), with the attention span capped at the window on sliding
    layers. With a frozen base (LoRA, QLoRA) the weight-gradient products are skipped: 4N.
    """
    cfg = _shape_cfg(shape_or_cfg)
    n = matmul_params(cfg)
    nh = cfg["num_attention_heads"]
    hd = cfg.get("head_dim") or cfg["hidden_size"] // nh
    L = cfg["num_hidden_layers"]
    types = layer_types(cfg)
    span = sum(min(seq, cfg.get("sliding_window") or seq) if t == "sliding_attention" else seq for t in types)
    attn = 12 * nh * hd * span
    weights = (6 if method == "full" else 4) * n
    assert len(types) == L
    return float(weights + attn)


def layer_types(cfg: dict) -> list[str]:
    L = cfg["num_hidden_layers"]
    if cfg.get("layer_types"):
        return list(cfg["layer_types"])
    every = family(cfg.get("model_type")).full_attention_every  # transformers' default (Gemma 3: 5 sliding, 1 full)
    if every:
        return ["full_attention" if (i + 1) % every == 0 else "sliding_attention" for i in range(L)]
    return ["full_attention"] * L


def peak_flops(device_name: str | None) -> float | None:
    if not device_name:
        return None
    for key, val in PEAK_BF16_FLOPS:
        if key.lower() in device_name.lower():
            return val
    return None


def mfu(tokens_per_s: float | None, shape: str | dict, seq: int, method: str, peak: float | None) -> float | None:
    if not tokens_per_s or not peak:
        return None
    return tokens_per_s * flops_per_token(shape, seq, method) / peak
