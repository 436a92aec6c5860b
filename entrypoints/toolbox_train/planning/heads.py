"""Which LM head SFT's training loss runs on (`train.lm_head_kernel`), resolved before anything loads.

TRL 1.15's fused head computes the log-probabilities in fixed tiles and recomputes each tile in its
backward; Liger's fused linear cross-entropy computes the gradients in its forward (no recompute) but
cuts the micro-batch into chunks whose size falls as the vocabulary grows against the hidden size.
Measured on one H100, 2026-12-06, full fine-tuning, finetune against finetune in one call
(docs/benchmarks.md, "The speed pick"):

| model, micro-batch | Liger's chunk | trl | liger |
|---|---|---|---|
| llama-1b, 16 x 2048 | 1,024 rows | 64,431 | 68,054 tok/s |
| llama-1b, 8 x 2048 | 512 rows | 61,885 | 63,572 tok/s |
| qwen3-0.6b, 8 x 2048 | 128 rows | 86,148 | 73,064 tok/s |
| gemma3-1b, 8 x 2048 | 128 rows | 54,836 | 43,640 tok/s |

So `auto`: Liger's head where Liger is on and either the head is frozen (LoRA, QLoRA: Liger skips the
head's weight gradient, one head GEMM fewer; GPT-OSS LoRA at par with bare + Liger) or Liger's chunks are
at least LIGER_MIN_CHUNK_ROWS rows; TRL's head otherwise.
"""

from __future__ import annotations

import importlib
import math

from toolbox_train.units import registry
from toolbox_train.contract import UserError

LIGER_MIN_CHUNK_ROWS = 512  # measured faster at 512 and 1,024 rows, slower at 128; 256 not measured


def liger_chunk_mem_const(text_config) -> int:
    """The chunk budget Liger's own forward of this model family gives its fused cross-entropy (GPT-OSS's:
    8, for a 201k vocabulary: 8 chunks of 1,024 tokens a step at 8,192 tokens instead of 64 of 128; what the
    bare + Liger loop runs), else Liger's default, 1. Read from Liger's model module when asked."""
    try:
        mod = importlib.import_module(f"liger_kernel.transformers.model.{text_config.model_type}")
    except (ImportError, AttributeError):
        return 1
    return next((v for k, v in vars(mod).items() if k.endswith("_FLCE_CHUNK_MEM_CONST") and type(v) is int), 1)


def liger_chunk_rows(tokens: int, hidden: int, vocab: int, mem_const: int = 1) -> int:
    """The rows of one chunk of Liger 0.8.5's fused linear cross-entropy over `tokens` positions: the
    next power of two of tokens / ceil(vocab / (mem_const x hidden))."""
    per = max(1, math.ceil(tokens / math.ceil(vocab / (mem_const * hidden))))
    return 1 << (per - 1).bit_length()


def check(cfg, liger: bool) -> None:
    """`train.lm_head_kernel: liger` where Liger's head cannot run: one line naming the field."""
    if cfg.train.lm_head_kernel == "liger" and not (liger and cfg.output.step_metrics == "loss"):
        raise UserError("train.lm_head_kernel: liger needs train.liger on (backend hf, a GPU, the next-token loss) and "
                        f"output.step_metrics: loss (Liger's head gives no entropy or accuracy); liger is "
                        f"{bool(liger)}, step_metrics {cfg.output.step_metrics}")


def resolve(cfg, text_config, liger: bool, batch: int, token_loss: bool) -> tuple[str, str]:
    """The run's LM head (planning/run.py): `check`, then `pick` with the resolved per-device batch."""
    check(cfg, liger)
    return pick(cfg, text_config, liger, batch, token_loss)


def pick(cfg, text_config, liger: bool, batch: int | None = None, token_loss: bool | None = None) -> tuple[str, str]:
    """(`trl` or `liger`, why) for `train.lm_head_kernel`, with the per-device batch (None: the config's)
    and whether the objective trains on the token loss (None: the config's objective's)."""
    k = cfg.train.lm_head_kernel
    if k != "auto":
        return k, "train.lm_head_kernel"
    token_loss = registry.of(cfg).token_loss if token_loss is None else token_loss
    if not liger or not token_loss or cfg.output.step_metrics != "loss":
        return "trl", "Liger off" if not liger else f"objective {cfg.objective}, step_metrics {cfg.output.step_metrics}"
    if cfg.method != "full":
        return "liger", "the head is frozen: no weight gradient, one head GEMM fewer"
    batch = cfg.train.per_device_batch_size if batch is None else batch
    try:
        hidden, vocab = int(text_config.hidden_size), int(text_config.vocab_size)
    except (AttributeError, TypeError, ValueError):
        return "trl", "the model's hidden or vocabulary size is not known"
    if not isinstance(batch, int):
        return "trl", "no micro-batch size"
    rows = liger_chunk_rows(batch * cfg.data.max_seq_length, hidden, vocab, liger_chunk_mem_const(text_config))
    if rows >= LIGER_MIN_CHUNK_ROWS:
        return "liger", f"Liger's chunks of {rows} rows, at least {LIGER_MIN_CHUNK_ROWS}: faster than TRL's head there"
    return "trl", f"Liger's chunks would be {rows} rows, under {LIGER_MIN_CHUNK_ROWS}: TRL's head is faster there"
