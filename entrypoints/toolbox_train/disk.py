"""Writing to disk on the training side: atomic writes (a reader - another node, a resumed run,
`bench render` - sees the old file or the new one, never half of one) and telling a full disk
from other write failures."""

from __future__ import annotations

import errno
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any


def atomic_write(path: Path, data: str | bytes) -> Path:
    """Write `data` to a unique temp file beside `path`, then rename it into place."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data.encode("utf-8") if isinstance(data, str) else data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def write_json(path: Path, obj: Any) -> Path:
    return atomic_write(path, json.dumps(obj, indent=2, default=str) + "\n")


def remove(path: Path) -> None:
    """A file or a folder with what it holds; a link alone (never what it points to)."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink()


_FULL = tuple((code, os.strerror(code)) for code in (errno.ENOSPC, errno.EDQUOT))


def disk_full(exc: BaseException, where: Path | None = None) -> str | None:
    """The cause's words ('No space left on device', 'Disk quota exceeded') when the failed write
    `exc` (or one it came from) met a full disk, else None. safetensors says it in its text ("os
    error 28"); torch.save only "unexpected pos" or "file write failed": then the file system of
    `where` with (almost) nothing left says it."""
    seen: set[int] = set()
    e: BaseException | None = exc
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        for code, words in _FULL:
            if (isinstance(e, OSError) and e.errno == code) or words in str(e) or f"os error {code})" in str(e):
                return words
        e = e.__cause__ or e.__context__
    if where is not None:
        try:
            st = os.statvfs(where)
        except OSError:
            return None
        if st.f_bavail * st.f_frsize < 2**20:  # a write that fails with under 1 MiB left
            return f"{os.strerror(errno.ENOSPC)} ({st.f_bavail * st.f_frsize // 1024} KiB free)"
    return None
