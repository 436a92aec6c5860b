"""Rows of the benchmark matrix, and the suites that choose them per shape."""

from __future__ import annotations

import dataclasses
import fnmatch
from typing import Any, Sequence

from toolbox_train.bench.shapes import BenchError, SHAPES


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
