"""What the export tests share besides fixtures (a plain module: `from conftest import` took
whichever conftest.py was imported first, tests/fuzz's when both folders ran)."""

from __future__ import annotations

from pathlib import Path

# Which real vocabulary each architecture's tiny model gets (Gemma 3's own is SentencePiece and
# not vendored; the converter takes any recognised BPE tokenizer for it).
ARCH_VOCAB = {"llama": "llama-bpe", "qwen3": "qwen2", "gemma3": "llama-bpe"}
CTX_LEN = 512


def finetune_run(model: Path, out: Path, method: str = "lora", steps: int = 6, **over) -> Path:
    from helpers.tiny import train_config, write_dataset
    from toolbox_train.commands import finetune

    data = write_dataset(out.parent / f"{out.name}-data.jsonl", "text", n=48)
    cfg = train_config(model, data, out, **{"method": method, "lora.r": 4, "lora.alpha": 8,
                                            "train.learning_rate": 2e-2, "train.max_steps": steps,
                                            "data.max_seq_length": 64, **over})
    finetune.run(cfg)
    return out


def heldout_text(n: int = 60, seed: int = 123) -> str:
    from helpers.tiny import _sentences

    return " ".join(_sentences(n, seed))
