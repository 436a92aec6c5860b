"""Writing files on the host so that a reader never sees half a file and a failure leaves the
old one: write beside the target, then rename. The one helper for toolbox's outputs."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from toolbox.errors import UserError


def atomic_write(path: Path, text: str | bytes, mode: int = 0o644) -> Path:
    path = Path(path)
    if path.is_dir():
        raise UserError(f"{path}: is a directory; --output names a file")
    parent = path.parent if str(path.parent) else Path(".")
    if not parent.is_dir():
        raise UserError(f"{path}: folder {parent} does not exist")
    data = text.encode("utf-8") if isinstance(text, str) else text
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=parent)
    except OSError as exc:
        raise UserError(f"{path}: cannot write in {parent}: {exc.strerror}") from None
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except OSError as exc:
        Path(tmp).unlink(missing_ok=True)
        raise UserError(f"{path}: cannot write: {exc.strerror}") from None
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path
