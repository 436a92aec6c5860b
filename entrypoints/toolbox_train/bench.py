"""Benchmark harness: a matrix of `finetune` configurations and bare reference loops on one GPU.

`bench run` builds each model shape locally from a config (random init, no hub), writes a
word-level tokenizer and a text dataset beside it, then runs every row of the matrix in its own
subprocess (Unsloth and Liger patch transformers at import time, so rows must not share a
process; a crash or OOM of one row is recorded and the rest go on). It writes results.json
after every row, then results.md (table, targets, memory scaling) and chart.png.

Rows:
  bare      the model + optimizer + a plain loop, no Trainer (per backend: hf, unsloth)
  trl       TRL's SFTTrainer with HF + PEFT run directly (what a user would otherwise run)
  finetune  toolbox_train.finetune.run() with backend/method set
  launch    `launch --strategy fsdp --nproc 1 -- finetune ...`
  memscale  LoRA at batch 1, growing sequence length until OOM (the longest that fits)
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import fnmatch
import json
import math
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Sequence

# --------------------------------------------------------------------------------------------
# Model shapes (configs of the public models; weights are random)

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
}

# Dense bf16 tensor-core peak (datasheet, no sparsity), matched against the device name.
PEAK_BF16_FLOPS = [
    ("H200", 989.4e12), ("H100 PCIe", 756.0e12), ("H100", 989.4e12), ("H800", 989.4e12),
    ("GH200", 989.4e12), ("A100", 312.0e12), ("L40S", 362.1e12), ("MI300X", 1307.4e12),
]

SPECIAL_TOKENS = ["<unk>", "<s>", "</s>", "<pad>"]
LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


class BenchError(Exception):
    """Bad input to the harness (exit 2)."""


# --------------------------------------------------------------------------------------------
# Rows


@dataclasses.dataclass
class Row:
    kind: str  # bare | trl | finetune | launch | memscale
    backend: str  # hf | unsloth
    method: str  # full | lora | qlora
    shape: str
    options: dict[str, Any] = dataclasses.field(default_factory=dict)
    label: str = ""

    @property
    def id(self) -> str:
        opts = "".join(f"+{k}" if v is True else f"+no-{k}" if v is False else f"+{k}={v}"
                       for k, v in sorted(self.options.items()) if v is not None)
        return f"{self.shape}/{self.kind}-{self.backend}-{self.method}{opts}"

    def needs_gpu(self) -> str | None:
        if self.backend == "unsloth":
            return "Unsloth imports only with a GPU"
        if self.method == "qlora":
            return "bitsandbytes 4-bit needs a GPU"
        if self.kind == "launch":
            return "FSDP needs a GPU (accelerate refuses it on CPU)"
        if self.options.get("liger") or self.options.get("compile"):
            return "Liger/Triton kernels need a GPU"
        return None


def build_matrix(shapes: Sequence[str], suite: str = "default") -> list[Row]:
    """The rows of a suite for each shape; the first shape gets the full set."""
    for s in shapes:
        if s not in SHAPES:
            raise BenchError(f"--shapes: unknown shape {s!r} (known: {', '.join(SHAPES)})")
    if suite not in SUITES:
        raise BenchError(f"--suite: unknown suite {suite!r} (known: {', '.join(SUITES)})")
    rows: list[Row] = []
    for i, shape in enumerate(shapes):
        rows += SUITES[suite](shape, i == 0)
    return rows


def _suite_default(shape: str, primary: bool) -> list[Row]:
    # most important first: a run cut short by its time limit still answers the targets
    r = [
        Row("bare", "unsloth", "lora", shape, label="bare Unsloth LoRA"),
        Row("finetune", "unsloth", "lora", shape, label="finetune unsloth lora"),
        Row("trl", "hf", "lora", shape, {"ckpt": True}, label="TRL SFTTrainer HF+PEFT LoRA"),
        Row("finetune", "hf", "lora", shape, label="finetune hf lora"),
        Row("bare", "hf", "full", shape, label="bare HF full (plain)"),
        Row("finetune", "hf", "full", shape, label="finetune hf full"),
        Row("finetune", "unsloth", "full", shape, label="finetune unsloth full"),
        Row("bare", "unsloth", "full", shape, label="bare Unsloth full"),
        Row("bare", "hf", "lora", shape, {"ckpt": True}, label="bare HF+PEFT LoRA, checkpointing"),
    ]
    if primary:
        r += [
            Row("bare", "hf", "full", shape, {"liger": True}, label="bare HF full + Liger"),
            Row("bare", "hf", "lora", shape, {"ckpt": True, "liger": True},
                label="bare HF+PEFT LoRA + Liger"),
            Row("finetune", "unsloth", "qlora", shape, label="finetune unsloth qlora"),
            Row("finetune", "hf", "qlora", shape, label="finetune hf qlora"),
            Row("launch", "hf", "full", shape, {"strategy": "fsdp"},
                label="launch fsdp --nproc 1, hf full"),
            Row("memscale", "unsloth", "lora", shape, label="memory scaling, Unsloth LoRA b1"),
            Row("memscale", "hf", "lora", shape, {"ckpt": True}, label="memory scaling, HF+PEFT LoRA b1"),
        ]
    return r


def _suite_explore(shape: str, primary: bool) -> list[Row]:
    """Full fine-tune settings to pick the toolbox's defaults from."""
    return [
        Row("finetune", "hf", "full", shape, {"ckpt": False}, label="finetune hf full, no checkpointing"),
        Row("finetune", "hf", "full", shape, {"ckpt": False, "optim": "adamw_torch_fused"},
            label="finetune hf full, no ckpt, fused AdamW"),
        Row("finetune", "unsloth", "full", shape, {"optim": "adamw_torch_fused"},
            label="finetune unsloth full, fused AdamW"),
        Row("bare", "hf", "full", shape, {"liger": True, "compile": "layers"},
            label="bare HF full + Liger + compiled layers"),
        Row("bare", "hf", "full", shape, {"liger": True, "batch": 16}, label="bare HF full + Liger, batch 16"),
        Row("bare", "unsloth", "full", shape, {"batch": 16}, label="bare Unsloth full, batch 16"),
        Row("finetune", "hf", "full", shape, {"ckpt": False, "batch": 16},
            label="finetune hf full, no checkpointing, batch 16"),
        Row("finetune", "unsloth", "lora", shape, {"padding_free": False},
            label="finetune unsloth lora, Unsloth's padding-free off"),
        Row("finetune", "unsloth", "lora", shape, {"padding_free": True},
            label="finetune unsloth lora, Unsloth's auto padding-free on"),
    ]


def _suite_smoke(shape: str, primary: bool) -> list[Row]:
    return [
        Row("bare", "hf", "full", shape, label="bare HF full (plain)"),
        Row("bare", "hf", "lora", shape, {"ckpt": True}, label="bare HF+PEFT LoRA, checkpointing"),
        Row("trl", "hf", "lora", shape, {"ckpt": True}, label="TRL SFTTrainer HF+PEFT LoRA"),
        Row("finetune", "hf", "lora", shape, label="finetune hf lora"),
        Row("finetune", "hf", "full", shape, label="finetune hf full"),
        Row("bare", "unsloth", "lora", shape, label="bare Unsloth LoRA"),
        Row("finetune", "unsloth", "lora", shape, label="finetune unsloth lora"),
    ]


def _suite_all(shape: str, primary: bool) -> list[Row]:
    return _suite_default(shape, primary) + (_suite_explore(shape, primary) if primary else [])


SUITES = {"default": _suite_default, "explore": _suite_explore, "smoke": _suite_smoke, "all": _suite_all}


def select_rows(rows: list[Row], patterns: Sequence[str]) -> list[Row]:
    """Keep rows whose id matches any glob (e.g. '*/finetune-*', 'llama-1b/bare-hf-full')."""
    if not patterns:
        return rows
    kept = [r for r in rows if any(fnmatch.fnmatch(r.id, p) for p in patterns)]
    if not kept:
        raise BenchError(f"--rows: {', '.join(patterns)} match no row (ids: {', '.join(r.id for r in rows)})")
    return kept


# --------------------------------------------------------------------------------------------
# FLOPs and MFU


def _shape_cfg(shape_or_cfg: str | dict) -> dict:
    return SHAPES[shape_or_cfg] if isinstance(shape_or_cfg, str) else shape_or_cfg


def matmul_params(cfg: dict) -> int:
    """Weights that take part in matrix products per token (all linear layers + LM head)."""
    h, L = cfg["hidden_size"], cfg["num_hidden_layers"]
    nh, nkv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    hd = cfg.get("head_dim") or h // nh
    attn = h * nh * hd + 2 * h * nkv * hd + nh * hd * h
    mlp = 3 * h * cfg["intermediate_size"]
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
    if cfg.get("model_type") == "gemma3_text":  # transformers' default: 5 sliding, 1 full
        return ["full_attention" if (i + 1) % 6 == 0 else "sliding_attention" for i in range(L)]
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


# --------------------------------------------------------------------------------------------
# Model, tokenizer and data built locally


def build_tokenizer(dest: Path, vocab_size: int):
    """A word-level tokenizer: word `w<i>` is token i, so a text of n words is n tokens."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    n = min(vocab_size, 32768)
    vocab = {t: i for i, t in enumerate(SPECIAL_TOKENS)}
    for i in range(len(SPECIAL_TOKENS), n):
        vocab[f"w{i}"] = i
    tk = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok = PreTrainedTokenizerFast(tokenizer_object=tk, unk_token="<unk>", bos_token="<s>",
                                  eos_token="</s>", pad_token="<pad>", model_max_length=1 << 20)
    tok.save_pretrained(dest)
    return tok


def build_model_dir(shape: str, dest: Path, device: str = "cpu") -> Path:
    """Random-init model of `shape` in bf16 + tokenizer, saved as a local HF model folder."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    kw = dict(SHAPES[shape])
    mt = kw.pop("model_type")
    cfg = AutoConfig.for_model(mt, bos_token_id=1, eos_token_id=2, pad_token_id=3, **kw)
    tmp = Path(tempfile.mkdtemp(prefix=".tmp-", dir=dest.parent))
    try:
        torch.manual_seed(0)
        with torch.device(device):
            model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
        model.save_pretrained(tmp)
        build_tokenizer(tmp, cfg.vocab_size)
        del model
        if dest.exists():
            shutil.rmtree(dest)
        tmp.rename(dest)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp)
    return dest


def write_text_dataset(path: Path, n: int, words: int, vocab: int, seed: int = 0, motif: int = 64) -> Path:
    """JSONL of `text` rows of `words` word-tokens: a random motif repeated, so loss can fall (copying)."""
    rng = random.Random(seed)
    lo = len(SPECIAL_TOKENS)
    tmp = path.with_suffix(".tmp")
    with open(tmp, "w") as f:
        for _ in range(n):
            m = [f"w{rng.randrange(lo, vocab)}" for _ in range(motif)]
            f.write(json.dumps({"text": " ".join((m * (words // motif + 1))[:words])}) + "\n")
    tmp.replace(path)
    return path


def read_token_batches(path: str, batch: int, seq: int, n: int):
    """The dataset's rows as id tensors (word `w<i>` is id i), so bare loops train on the same data."""
    import torch

    rows = []
    with open(path) as f:
        for line in f:
            words = json.loads(line)["text"].split()[:seq]
            rows.append([int(w[1:]) for w in words])
            if len(rows) == batch * n:
                break
    if len(rows) < batch * n:
        raise RuntimeError(f"{path}: {len(rows)} rows, {batch * n} needed")
    return [torch.tensor(rows[i * batch:(i + 1) * batch]) for i in range(n)]


# --------------------------------------------------------------------------------------------
# Row workers (each runs in its own process)


class StepTimer:
    """Wall time between consecutive optimizer-step ends, with the device synchronised."""

    def __init__(self, device: str):
        self.device = device
        self.t_last: float | None = None
        self.times: list[float] = []

    def sync(self):
        if self.device.startswith("cuda"):
            import torch

            torch.cuda.synchronize()

    def start(self):
        self.sync()
        self.t_last = time.perf_counter()

    def step(self) -> float:
        self.sync()
        t = time.perf_counter()
        dt = t - self.t_last
        self.t_last = t
        self.times.append(dt)
        return dt


def count_tokens(batch: dict) -> int:
    """Tokens actually processed in a (micro-)batch: padding excluded.

    Padded batches carry attention_mask; padding-free (packed, flattened) batches carry
    position_ids or cu_seq_lens and no padding at all.
    """
    am = batch.get("attention_mask")
    if am is not None:
        return int(am.sum())
    return int(batch["input_ids"].numel())


class CountingCollator:
    """Wraps a Trainer's collator to count the tokens of each batch it hands out."""

    def __init__(self, inner):
        self.inner = inner
        self.tokens = 0

    def __call__(self, features):
        batch = self.inner(features)
        self.tokens += count_tokens(batch)
        return batch


def _device(spec: dict) -> str:
    return spec.get("device", "cuda")


def _reset_peak(device: str):
    if device.startswith("cuda"):
        import torch

        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


def _peak_gib(device: str) -> float | None:
    if device.startswith("cuda"):
        import torch

        return torch.cuda.max_memory_allocated() / 2**30
    return None


def _apply_liger(model):
    from liger_kernel.transformers import _apply_liger_kernel_to_instance

    _apply_liger_kernel_to_instance(model=model)


def _load_hf(spec: dict, model_dir: str):
    import torch
    from transformers import AutoModelForCausalLM

    method, opts, device = spec["method"], spec["options"], _device(spec)
    kw: dict[str, Any] = dict(dtype=torch.bfloat16, attn_implementation="sdpa")
    if method == "qlora":
        from transformers import BitsAndBytesConfig

        kw["quantization_config"] = BitsAndBytesConfig(
            load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=torch.bfloat16)
        kw["device_map"] = {"": 0}
    model = AutoModelForCausalLM.from_pretrained(model_dir, **kw)
    if method != "qlora":
        model.to(device)
    if opts.get("liger"):
        _apply_liger(model)
    if opts.get("ckpt"):
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if method in ("lora", "qlora"):
        from peft import LoraConfig, get_peft_model

        if method == "qlora":
            from peft import prepare_model_for_kbit_training

            model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=bool(opts.get("ckpt")))
        if opts.get("ckpt"):
            model.enable_input_require_grads()
        model = get_peft_model(model, LoraConfig(r=16, lora_alpha=16, lora_dropout=0.0,
                                                 target_modules=LORA_TARGETS, task_type="CAUSAL_LM"))
    if opts.get("compile") == "layers":
        base = model.get_base_model() if hasattr(model, "get_base_model") else model
        for layer in base.model.layers:
            layer.compile()
    elif opts.get("compile") == "model":
        model.compile()
    return model


def _load_unsloth(spec: dict, model_dir: str, seq: int):
    import torch
    from unsloth import FastLanguageModel, FastModel

    method = spec["method"]
    # as finetune does: FastModel for Gemma 3, FastLanguageModel for the text-only families
    loader = FastModel if SHAPES[spec["shape"]]["model_type"].startswith("gemma3") else FastLanguageModel
    model, _tok = loader.from_pretrained(
        model_name=model_dir, max_seq_length=seq, dtype=torch.bfloat16,
        load_in_4bit=method == "qlora", full_finetuning=method == "full",
        use_gradient_checkpointing="unsloth")
    if method in ("lora", "qlora"):
        kw: dict[str, Any] = dict(r=16, lora_alpha=16, lora_dropout=0, bias="none",
                                  use_gradient_checkpointing="unsloth", random_state=0)
        if loader is FastModel:
            kw.update(finetune_vision_layers=False, finetune_language_layers=True,
                      finetune_attention_modules=True, finetune_mlp_modules=True)
        else:
            kw["target_modules"] = LORA_TARGETS
        model = loader.get_peft_model(model, **kw)
    return model


def run_bare(spec: dict, model_dir: str) -> dict:
    """The model, AdamW and a plain loop: the backend's best case, no Trainer in the way."""
    import torch

    device, opts = _device(spec), spec["options"]
    batch, seq = opts.get("batch", spec["batch"]), spec["seq"]
    _reset_peak(device)
    if spec["backend"] == "unsloth":
        model = _load_unsloth(spec, model_dir, seq)
    else:
        model = _load_hf(spec, model_dir)
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    fused = {"fused": True} if device.startswith("cuda") else {}
    opt = torch.optim.AdamW(params, lr=spec["lr"][spec["method"] if spec["method"] == "full" else "lora"],
                            weight_decay=0.0, **fused)
    n_steps = spec["warmup"] + spec["steps"]
    batches = read_token_batches(spec["data"], batch, seq, n_steps)
    timer, losses, tokens = StepTimer(device), [], []
    timer.start()
    for cpu_ids in batches:
        ids = cpu_ids.to(device, non_blocking=True)
        mb = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
        out = model(**mb, labels=ids)
        out.loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(float(out.loss.detach()))
        tokens.append(count_tokens(mb))
        timer.step()
        del out
    return _result_from_steps(spec, timer.times, tokens, losses, _peak_gib(device))


def run_trl(spec: dict, model_dir: str, data_path: str, workdir: str) -> dict:
    """TRL SFTTrainer with HF + PEFT LoRA, as its documentation shows it."""
    import torch
    from datasets import load_dataset
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import SFTConfig, SFTTrainer

    device, opts = _device(spec), spec["options"]
    cpu = not device.startswith("cuda")
    _reset_peak(device)
    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16, attn_implementation="sdpa")
    if opts.get("liger"):
        _apply_liger(model)
    ds = load_dataset("json", data_files=data_path, split="train")
    args = SFTConfig(
        output_dir=workdir, per_device_train_batch_size=opts.get("batch", spec["batch"]),
        gradient_accumulation_steps=1, max_steps=spec["warmup"] + spec["steps"],
        learning_rate=spec["lr"]["lora"], lr_scheduler_type="constant", warmup_steps=0, weight_decay=0.0,
        logging_steps=1, save_strategy="no", report_to="none", bf16=True, use_cpu=cpu,
        gradient_checkpointing=bool(opts.get("ckpt")), max_length=spec["seq"], packing=False,
        dataset_text_field="text", optim="adamw_torch" if cpu else "adamw_torch_fused",
        dataloader_num_workers=0, seed=0, disable_tqdm=True,
    )
    timer, losses, tokens = StepTimer(device), [], []

    class Timing(TrainerCallback):
        def on_train_begin(self, *a, **k):
            self.seen = 0
            timer.start()

        def on_step_end(self, *a, **k):
            timer.step()
            tokens.append(collator.tokens - self.seen)
            self.seen = collator.tokens

        def on_log(self, args, state, control, logs=None, **k):
            if logs and "loss" in logs:
                losses.append(float(logs["loss"]))

    trainer_cls = SFTTrainer
    if cpu:
        from transformers import Trainer

        class CPUSFTTrainer(SFTTrainer):
            # TRL 1.15's loss is a Triton kernel; only the harness's CPU tests take this path.
            def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
                return Trainer.compute_loss(self, model, inputs, return_outputs, num_items_in_batch)

        trainer_cls = CPUSFTTrainer
    trainer = trainer_cls(model=model, args=args, train_dataset=ds, processing_class=tok,
                         peft_config=LoraConfig(r=16, lora_alpha=16, lora_dropout=0.0,
                                                target_modules=LORA_TARGETS, task_type="CAUSAL_LM"),
                         callbacks=[Timing()])
    collator = CountingCollator(trainer.data_collator)
    trainer.data_collator = collator
    trainer.train()
    return _result_from_steps(spec, timer.times, tokens, losses, _peak_gib(device))


def finetune_config(spec: dict, model_dir: str, data_path: str, output_dir: str) -> dict:
    """The train.yaml a user would write for this row; everything else is finetune's own default."""
    opts = spec["options"]
    train: dict[str, Any] = {
        "max_steps": spec["warmup"] + spec["steps"],
        "per_device_batch_size": opts.get("batch", spec["batch"]),
        "learning_rate": spec["lr"]["full" if spec["method"] == "full" else "lora"],
        "lr_scheduler": "constant",
        "precision": "bf16" if _device(spec).startswith("cuda") else "fp32",
        "seed": 0,
    }
    for opt, key in (("ckpt", "gradient_checkpointing"), ("liger", "liger"), ("optim", "optimizer")):
        if opt in opts:
            train[key] = opts[opt]
    cfg: dict[str, Any] = {
        "model": {"path": model_dir},
        "data": {"path": data_path, "format": "text", "max_seq_length": spec["seq"],
                 "packing": bool(opts.get("packing", False))},
        "method": spec["method"],
        "backend": spec["backend"],
        "train": train,
        "output": {"dir": output_dir, "save_steps": 0, "logging_steps": 1, "progress_bar": False},
    }
    if spec["method"] != "full":
        cfg["lora"] = {"r": 16, "alpha": 16, "dropout": 0.0, "target_modules": LORA_TARGETS}
    return cfg


def _steps_from_metrics(out_dir: Path) -> tuple[list[float], list[int], list[float], float | None]:
    """Per-step time and tokens from finetune's metrics.jsonl (`tokens` is the running total)."""
    times, tokens, losses, peaks = [], [], [], []
    prev = 0
    with open(out_dir / "metrics.jsonl") as f:
        for line in f:
            if not line.strip():
                continue
            m = json.loads(line)
            n = int(m["tokens"]) - prev
            prev = int(m["tokens"])
            if n <= 0 or not m.get("tokens_per_s"):
                continue
            tokens.append(n)
            times.append(n / m["tokens_per_s"])
            losses.append(float(m["loss"]))
            if m.get("peak_mem_gib") is not None:
                peaks.append(float(m["peak_mem_gib"]))
    return times, tokens, losses, (max(peaks) if peaks else None)


def run_finetune(spec: dict, model_dir: str, data_path: str, workdir: str) -> dict:
    from toolbox_train import finetune

    device = _device(spec)
    out_dir = Path(workdir) / "out"
    _reset_peak(device)
    finetune.run(finetune_config(spec, model_dir, data_path, str(out_dir)), overrides=spec.get("set", ()),
                 overwrite=True)
    times, tokens, losses, _ = _steps_from_metrics(out_dir)
    res = _result_from_steps(spec, times, tokens, losses, _peak_gib(device))
    res["resolved"] = _resolved(out_dir)
    return res


def run_launch(spec: dict, model_dir: str, data_path: str, workdir: str) -> dict:
    import yaml

    out_dir = Path(workdir) / "out"
    cfg_path = Path(workdir) / "train.yaml"
    cfg_path.write_text(yaml.safe_dump(finetune_config(spec, model_dir, data_path, str(out_dir))))
    cmd = [sys.executable, "-m", "toolbox_train.launch", "--strategy", spec["options"].get("strategy", "fsdp"),
           "--nproc", "1", "--", "finetune", "--config", str(cfg_path), "--overwrite"]
    print("+", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True)
    times, tokens, losses, peak = _steps_from_metrics(out_dir)
    res = _result_from_steps(spec, times, tokens, losses, peak)
    res["command"] = " ".join(cmd[2:])
    res["resolved"] = _resolved(out_dir)
    return res


def _resolved(out_dir: Path) -> dict | None:
    p = out_dir / "config.resolved.yaml"
    if not p.exists():
        return None
    import yaml

    return yaml.safe_load(p.read_text())


def run_memscale(spec: dict, model_dir: str) -> dict:
    """LoRA at batch 1: one training step per length, doubling until out of memory."""
    import torch

    device = _device(spec)
    lengths = spec.get("lengths") or [8192 * 2**i for i in range(6)]
    max_pos = SHAPES[spec["shape"]]["max_position_embeddings"]
    lengths = [n for n in lengths if n <= max_pos]
    model = (_load_unsloth(spec, model_dir, max(lengths)) if spec["backend"] == "unsloth"
             else _load_hf(spec, model_dir))
    model.train()
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)
    probes = []
    for n in lengths:
        _reset_peak(device)
        ids = torch.randint(len(SPECIAL_TOKENS), spec["tok_vocab"], (1, n)).to(device)
        t0 = time.perf_counter()
        try:
            out = model(input_ids=ids, labels=ids)
            out.loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            StepTimer(device).sync()
            probes.append({"seq": n, "fits": True, "peak_gib": _peak_gib(device),
                           "step_s": time.perf_counter() - t0})
            del out
        except torch.OutOfMemoryError:
            probes.append({"seq": n, "fits": False})
            break
        finally:
            opt.zero_grad(set_to_none=True)
        print(f"memscale {spec['backend']}: {probes[-1]}", flush=True)
    fit = [p["seq"] for p in probes if p["fits"]]
    return {"status": "ok", "probes": probes, "max_seq": max(fit) if fit else 0,
            "max_seq_bounded": bool(probes) and probes[-1]["fits"]}


def _result_from_steps(spec: dict, times: list[float], tokens: list[int], losses: list[float],
                       peak: float | None) -> dict:
    w = spec["warmup"]
    if len(times) <= w:
        raise RuntimeError(f"only {len(times)} steps recorded, {w} are warm-up: nothing timed")
    timed_t, timed_n = times[w:], tokens[w:]
    per_step = [n / t for n, t in zip(timed_n, timed_t)]
    return {
        "status": "ok",
        "tokens_per_s": sum(per_step) / len(per_step),
        "tokens_per_s_stdev": _stdev(per_step),
        "tokens_per_step": sum(timed_n) / len(timed_n),
        "step_s": sum(timed_t) / len(timed_t),
        "steps_timed": len(timed_t),
        "peak_gib": peak,
        "step_times": [round(t, 4) for t in times],
        "loss_first": losses[0] if losses else None,
        "loss_last": losses[-1] if losses else None,
    }


def _stdev(xs: list[float]) -> float:
    m = sum(xs) / len(xs)
    return math.sqrt(sum((x - m) ** 2 for x in xs) / max(1, len(xs) - 1))


def worker(spec_path: str, result_path: str) -> int:
    spec = json.loads(Path(spec_path).read_text())
    t0 = time.time()
    pf = spec["options"].get("padding_free")
    if pf is not None:  # Unsloth's auto padding-free (finetune turns it off unless told): read at import
        os.environ["UNSLOTH_DISABLE_AUTO_PADDING_FREE"] = "0" if pf else "1"
    if spec["backend"] == "unsloth" and spec["kind"] in ("bare", "memscale"):  # finetune imports it itself
        import unsloth  # noqa: F401  (must patch transformers/trl/peft before they are imported)
    import torch

    if spec.get("device", "cuda").startswith("cuda"):
        torch.backends.cuda.matmul.allow_tf32 = True
    kind = spec["kind"]
    workdir = tempfile.mkdtemp(prefix="row-", dir=spec["workdir"])
    try:
        if kind == "bare":
            res = run_bare(spec, spec["model_dir"])
        elif kind == "trl":
            res = run_trl(spec, spec["model_dir"], spec["data"], workdir)
        elif kind == "finetune":
            res = run_finetune(spec, spec["model_dir"], spec["data"], workdir)
        elif kind == "launch":
            res = run_launch(spec, spec["model_dir"], spec["data"], workdir)
        elif kind == "memscale":
            res = run_memscale(spec, spec["model_dir"])
        else:
            raise ValueError(f"unknown row kind {kind!r}")
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    res["wall_s"] = time.time() - t0
    res["versions"] = versions()
    _write_json(Path(result_path), res)
    return 0


# --------------------------------------------------------------------------------------------
# Environment


def versions() -> dict[str, str]:
    from importlib import metadata

    v = {"python": sys.version.split()[0]}
    for d in ("torch", "transformers", "trl", "peft", "accelerate", "datasets", "unsloth", "unsloth_zoo",
              "liger-kernel", "bitsandbytes", "triton", "toolbox-train"):
        with contextlib.suppress(metadata.PackageNotFoundError):
            v[d] = metadata.version(d)
    with contextlib.suppress(Exception):
        import torch

        v["cuda"] = str(torch.version.cuda)
    return v


def device_info(device: str) -> dict:
    info: dict[str, Any] = {"device": device}
    if device.startswith("cuda"):
        import torch

        if not torch.cuda.is_available():
            raise BenchError("--device cuda: no CUDA/ROCm device is visible (use --device cpu)")
        p = torch.cuda.get_device_properties(0)
        info.update(name=p.name, memory_gib=round(p.total_memory / 2**30, 1))
    else:
        import platform

        info.update(name=platform.processor() or platform.machine())
    return info


# --------------------------------------------------------------------------------------------
# Orchestration


def _write_json(path: Path, obj) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(obj, indent=2, default=str) + "\n")
    tmp.replace(path)


def run_matrix(rows: list[Row], out: Path, *, device: str = "cuda", seq: int = 2048, batch: int = 8,
               warmup: int = 3, steps: int = 10, peak_tflops: float | None = None,
               row_timeout: float = 600, workdir: Path | None = None, command: str = "") -> dict:
    out.mkdir(parents=True, exist_ok=True)
    dinfo = device_info(device)
    peak = peak_tflops * 1e12 if peak_tflops else peak_flops(dinfo.get("name"))
    work = Path(workdir or tempfile.mkdtemp(prefix="toolbox-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    results: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "command": command,
        "device": dinfo, "peak_bf16_flops": peak, "seq": seq, "batch": batch, "warmup": warmup,
        "steps": steps, "versions": versions(), "rows": [],
    }
    built: dict[str, tuple[str, str, int]] = {}
    for row in rows:
        rec: dict[str, Any] = {"id": row.id, **dataclasses.asdict(row)}
        reason = row.needs_gpu() if not device.startswith("cuda") else None
        if reason:
            rec.update(status="skipped", error=reason)
            results["rows"].append(rec)
            continue
        if row.shape not in built:
            mdir = work / f"model-{row.shape}"
            t0 = time.time()
            build_model_dir(row.shape, mdir, device if device.startswith("cuda") else "cpu")
            vocab = min(SHAPES[row.shape]["vocab_size"], 32768)
            n_rows = 2 * max(batch, 16) * (warmup + steps) + 64
            data = write_text_dataset(work / f"data-{row.shape}.jsonl", n_rows, seq + 16, vocab)
            built[row.shape] = (str(mdir), str(data), vocab)
            print(f"bench: built {row.shape} in {time.time() - t0:.1f}s", flush=True)
        mdir, data, vocab = built[row.shape]
        spec = {**dataclasses.asdict(row), "device": device, "seq": seq, "batch": batch, "warmup": warmup,
                "steps": steps, "model_dir": mdir, "data": data, "tok_vocab": vocab, "workdir": str(work),
                "lr": {"full": 1e-5, "lora": 2e-4}}
        spec_path, res_path = work / "spec.json", work / "result.json"
        _write_json(spec_path, spec)
        res_path.unlink(missing_ok=True)
        print(f"bench: --- {row.id}", flush=True)
        t0 = time.time()
        try:
            p = subprocess.run([sys.executable, "-m", "toolbox_train.bench", "_row", str(spec_path), str(res_path)],
                               timeout=row_timeout)
            rc = p.returncode
        except subprocess.TimeoutExpired:
            rc = "timeout"
        if rc == 0 and res_path.exists():
            rec.update(json.loads(res_path.read_text()))
            if rec.get("tokens_per_s"):
                m = mfu(rec["tokens_per_s"], row.shape, seq, row.method, peak)
                rec["mfu"] = m
        else:
            rec.update(status="failed", error=f"exit {rc} after {time.time() - t0:.0f}s (see log)")
        print(f"bench: {row.id}: {_brief(rec)}", flush=True)
        results["rows"].append(rec)
        results["targets"] = targets(results)
        _write_json(out / "results.json", results)
    results["targets"] = targets(results)
    _write_json(out / "results.json", results)
    shutil.rmtree(work, ignore_errors=True) if workdir is None else None
    return results


def _brief(rec: dict) -> str:
    if rec.get("status") != "ok":
        return f"{rec.get('status')}: {rec.get('error')}"
    if rec["kind"] == "memscale":
        return f"max seq {rec['max_seq']}"
    return (f"{rec['tokens_per_s']:,.0f} tok/s, peak {_fmt(rec.get('peak_gib'), '.1f')} GiB, "
            f"loss {rec['loss_first']:.3f} -> {rec['loss_last']:.3f}")


# --------------------------------------------------------------------------------------------
# Targets (issue 7) as measured ratios


def _find(rows: list[dict], shape: str, kind: str, backend: str, method: str, **opts) -> dict | None:
    """The ok row of exactly these options (none given: the plain row)."""
    for r in rows:
        if (r["shape"], r["kind"], r["backend"], r["method"]) == (shape, kind, backend, method) \
                and r.get("status") == "ok" and r["options"] == opts:
            return r
    return None


def targets(results: dict) -> list[dict]:
    rows = results["rows"]
    out = []
    for shape in dict.fromkeys(r["shape"] for r in rows):
        ft_u = _find(rows, shape, "finetune", "unsloth", "lora")
        ft_h = _find(rows, shape, "finetune", "hf", "lora")
        bare_u = _find(rows, shape, "bare", "unsloth", "lora")
        trl_h = _find(rows, shape, "trl", "hf", "lora", ckpt=True)
        bare_full = _find(rows, shape, "bare", "hf", "full")
        # the toolbox's own defaults: finetune full rows with no option set
        fulls = [r for r in rows if r["shape"] == shape and r["kind"] == "finetune" and r["method"] == "full"
                 and r.get("status") == "ok" and not r["options"]]
        best_full = max(fulls, key=lambda r: r["tokens_per_s"]) if fulls else None

        def add(name, a, b, key, goal, cmp):
            if a and b and a.get(key) and b.get(key):
                ratio = a[key] / b[key]
                out.append({"shape": shape, "target": name, "measured": ratio, "goal": goal,
                            "met": ratio >= goal if cmp == ">=" else ratio <= goal, "cmp": cmp,
                            "rows": [a["id"], b["id"]]})

        add("finetune unsloth lora / bare Unsloth lora, tokens/s", ft_u, bare_u, "tokens_per_s", 0.95, ">=")
        add("finetune unsloth lora / bare Unsloth lora, peak memory", ft_u, bare_u, "peak_gib", 1.1, "<=")
        add("finetune unsloth lora / TRL+PEFT, tokens/s", ft_u, trl_h, "tokens_per_s", 1.6, ">=")
        add("finetune hf lora / TRL+PEFT, tokens/s", ft_h, trl_h, "tokens_per_s", 0.95, ">=")
        add("best finetune full / plain HF full, peak memory", best_full, bare_full, "peak_gib", 0.5, "<=")
        if best_full and results.get("device", {}).get("name", "").find("H200") >= 0 and shape == "llama-1b":
            out.append({"shape": shape, "target": "best finetune full, tokens/s (H200)",
                        "measured": best_full["tokens_per_s"], "goal": 75000, "cmp": ">=",
                        "met": best_full["tokens_per_s"] >= 75000, "rows": [best_full["id"]]})
    return out


# --------------------------------------------------------------------------------------------
# Report: markdown table and chart


def _fmt(x, spec: str = ",.0f") -> str:
    return "-" if x is None else format(x, spec)


def _opts(r: dict) -> str:
    return ", ".join(k if v is True else f"no {k}" if v is False else f"{k}={v}"
                     for k, v in sorted(r["options"].items()) if v is not None)


def render_table(results: dict) -> str:
    lines = []
    d = results.get("device", {})
    lines.append(f"Device: {d.get('name')} | seq {results['seq']}, batch {results['batch']}, "
                 f"{results['warmup']} warm-up + {results['steps']} timed steps | {results.get('date')}")
    lines.append("")
    lines.append("| shape | row | backend | method | options | tokens/s | peak GiB | MFU | loss first → last | status |")
    lines.append("|---|---|---|---|---|---:|---:|---:|---|---|")
    for r in results["rows"]:
        if r["kind"] == "memscale":
            continue
        ok = r.get("status") == "ok"
        loss = f"{r['loss_first']:.3f} → {r['loss_last']:.3f}" if ok and r.get("loss_first") is not None else "-"
        status = "ok" if ok else f"{r.get('status')}: {r.get('error', '')}".replace("|", "/")
        lines.append(f"| {r['shape']} | {r.get('label') or r['kind']} | {r['backend']} | {r['method']} | {_opts(r)} "
                     f"| {_fmt(r.get('tokens_per_s')) if ok else '-'} | {_fmt(r.get('peak_gib'), '.1f') if ok else '-'} "
                     f"| {_fmt(r.get('mfu') * 100, '.1f') + '%' if ok and r.get('mfu') else '-'} | {loss} | {status} |")
    if results.get("targets"):
        lines += ["", "| shape | target | measured | goal | met |", "|---|---|---:|---:|---|"]
        for t in results["targets"]:
            m = _fmt(t["measured"], ",.0f") if t["goal"] > 100 else f"{t['measured']:.2f}x"
            g = _fmt(t["goal"], ",.0f") if t["goal"] > 100 else f"{t['cmp']} {t['goal']}x"
            lines.append(f"| {t['shape']} | {t['target']} | {m} | {g} | {'yes' if t['met'] else 'NO'} |")
    mem = [r for r in results["rows"] if r["kind"] == "memscale"]
    if mem:
        lines += ["", "Memory scaling: LoRA r16, batch 1, one training step per length (✗ = out of memory)", "",
                  "| shape | backend | longest seq that fits | probes (seq: peak GiB) |", "|---|---|---:|---|"]
        for r in mem:
            if r.get("status") != "ok":
                lines.append(f"| {r['shape']} | {r['backend']} | - | {r.get('status')}: {r.get('error')} |")
                continue
            probes = ", ".join(f"{p['seq']}: {p['peak_gib']:.1f}" if p["fits"] and p.get("peak_gib") is not None
                               else f"{p['seq']}: {'ok' if p['fits'] else '✗'}" for p in r["probes"])
            best = f"{r['max_seq']:,}" + (" (all probed lengths fit)" if r.get("max_seq_bounded") else "")
            lines.append(f"| {r['shape']} | {r['backend']} | {best} | {probes} |")
    return "\n".join(lines) + "\n"


def render_chart(results: dict, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ok = [r for r in results["rows"] if r.get("status") == "ok" and r["kind"] != "memscale"]
    shapes = list(dict.fromkeys(r["shape"] for r in ok)) or ["(no rows)"]
    heights = [max(1, sum(r["shape"] == s for r in ok)) for s in shapes]
    fig, axes = plt.subplots(len(shapes), 2, figsize=(13, 1.2 + 0.38 * sum(heights) + 0.6 * len(shapes)),
                             squeeze=False, gridspec_kw={"height_ratios": heights})
    colors = {"bare": "#9e9e9e", "trl": "#e08a3c", "finetune": "#2f6fb0", "launch": "#6a4fb0"}
    for (ax_t, ax_m), shape in zip(axes, shapes):
        rs = [r for r in ok if r["shape"] == shape][::-1]
        labels = [f"{r.get('label') or r['id']}" for r in rs]
        c = [colors.get(r["kind"], "#555") for r in rs]
        y = range(len(rs))
        ax_t.barh(y, [r["tokens_per_s"] for r in rs], color=c)
        ax_t.set_yticks(list(y), labels, fontsize=8)
        ax_t.set_title(f"{shape}: tokens/s (higher is better)", fontsize=9)
        ax_m.barh(y, [r.get("peak_gib") or 0 for r in rs], color=c)
        ax_m.set_yticks(list(y), [""] * len(rs))
        ax_m.set_title(f"{shape}: peak allocated GiB (lower is better)", fontsize=9)
        for ax, key, f in ((ax_t, "tokens_per_s", "{:,.0f}"), (ax_m, "peak_gib", "{:.1f}")):
            for yi, r in zip(y, rs):
                if r.get(key) is not None:
                    ax.text(r[key], yi, " " + f.format(r[key]), va="center", fontsize=7)
            ax.margins(x=0.18)
            ax.tick_params(axis="x", labelsize=7)
    d = results.get("device", {})
    fig.suptitle(f"finetune vs references on {d.get('name')}, seq {results['seq']}, batch {results['batch']}, bf16 "
                 "(grey: bare loops, orange: TRL direct, blue: finetune, purple: launch)", fontsize=9)
    fig.tight_layout()
    tmp = path.with_name(f".{path.stem}.tmp.png")
    fig.savefig(tmp, dpi=110)
    plt.close(fig)
    tmp.replace(path)
    return path


def merge(paths: Sequence[Path]) -> dict:
    """Combine results.json files (e.g. shapes run in separate device calls)."""
    merged: dict | None = None
    for p in paths:
        try:
            r = json.loads(Path(p).read_text())
        except (OSError, json.JSONDecodeError) as e:
            raise BenchError(f"{p}: cannot read results ({e})") from e
        if not isinstance(r, dict) or "rows" not in r:
            raise BenchError(f"{p}: not a bench results.json (no 'rows')")
        if merged is None:
            merged = r
            continue
        seen = {x["id"]: i for i, x in enumerate(merged["rows"])}
        for x in r["rows"]:  # a later file's row replaces an earlier one of the same id
            if x["id"] in seen:
                merged["rows"][seen[x["id"]]] = x
            else:
                merged["rows"].append(x)
        merged.setdefault("merged_dates", [merged.get("date")]).append(r.get("date"))
    if merged is None:
        raise BenchError("no results.json given")
    merged["targets"] = targets(merged)
    return merged


def write_report(results: dict, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    _write_json(out / "results.json", results)
    tmp = out / ".results.md.tmp"
    tmp.write_text(render_table(results))
    tmp.replace(out / "results.md")
    render_chart(results, out / "chart.png")


# --------------------------------------------------------------------------------------------
# CLI


def build_parser(p: argparse.ArgumentParser | None = None) -> argparse.ArgumentParser:
    p = p or argparse.ArgumentParser(prog="bench", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="bench_cmd", required=True)
    r = sub.add_parser("run", help="run the matrix and write results.json, results.md, chart.png")
    r.add_argument("--shapes", default="llama-1b", help=f"comma-separated, of: {', '.join(SHAPES)}")
    r.add_argument("--suite", default="default", choices=list(SUITES))
    r.add_argument("--rows", action="append", default=[], help="glob over row ids (repeatable)")
    r.add_argument("--out", type=Path, default=Path("bench-out"))
    r.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    r.add_argument("--seq", type=int, default=2048)
    r.add_argument("--batch", type=int, default=8)
    r.add_argument("--warmup", type=int, default=3)
    r.add_argument("--steps", type=int, default=10)
    r.add_argument("--peak-tflops", type=float, help="dense bf16 peak of the device (default: by its name)")
    r.add_argument("--row-timeout", type=float, default=600)
    r.add_argument("--workdir", type=Path, help="where models and data are built (default: a temp dir)")
    r.add_argument("--no-chart", action="store_true", help="write results.json and results.md only")
    ls = sub.add_parser("list", help="print the row ids of a suite")
    ls.add_argument("--shapes", default="llama-1b")
    ls.add_argument("--suite", default="default", choices=list(SUITES))
    ls.add_argument("--rows", action="append", default=[])
    rd = sub.add_parser("render", help="merge results.json files and write results.md + chart.png")
    rd.add_argument("results", nargs="+", type=Path)
    rd.add_argument("--out", type=Path, required=True)
    return p


def _shapes(s: str) -> list[str]:
    return [x.strip() for x in s.split(",") if x.strip()]


def dispatch(args: argparse.Namespace) -> int:
    if args.bench_cmd == "list":
        for row in select_rows(build_matrix(_shapes(args.shapes), args.suite), args.rows):
            print(row.id)
        return 0
    if args.bench_cmd == "render":
        write_report(merge(args.results), args.out)
        print(f"bench: wrote {args.out / 'results.md'} and {args.out / 'chart.png'}")
        return 0
    for name in ("seq", "batch", "steps"):
        if getattr(args, name) < 1:
            raise BenchError(f"--{name}: must be >= 1, got {getattr(args, name)}")
    if args.warmup < 0:
        raise BenchError(f"--warmup: must be >= 0, got {args.warmup}")
    rows = select_rows(build_matrix(_shapes(args.shapes), args.suite), args.rows)
    results = run_matrix(rows, args.out, device=args.device, seq=args.seq, batch=args.batch, warmup=args.warmup,
                         steps=args.steps, peak_tflops=args.peak_tflops, row_timeout=args.row_timeout,
                         workdir=args.workdir, command=" ".join(["bench", *sys.argv[1:]]))
    if args.no_chart:
        tmp = args.out / ".results.md.tmp"
        tmp.write_text(render_table(results))
        tmp.replace(args.out / "results.md")
    else:
        write_report(results, args.out)
    print(render_table(results))
    failed = [r["id"] for r in results["rows"] if r.get("status") == "failed"]
    if failed:
        print(f"bench: {len(failed)} row(s) failed: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["_row"]:
        return worker(argv[1], argv[2])
    args = build_parser().parse_args(argv)
    try:
        return dispatch(args)
    except BenchError as e:
        print(f"bench: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
