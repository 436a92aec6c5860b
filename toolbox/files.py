"""Writing files on the host so that a reader never sees half a file and a failure leaves the
old one: the training package's one durable atomic write (toolbox_train.disk), which refuses a
missing folder here (an `--output` names a place that exists)."""

from __future__ import annotations

from pathlib import Path

from toolbox_train.disk import atomic_write as _atomic_write
from toolbox_train.disk import write_error

__all__ = ["atomic_write", "write_error"]


def atomic_write(path: Path, text: str | bytes, mode: int = 0o644) -> Path:
    return _atomic_write(path, text, mode, parents=False)
