"""Writing files on the host so that a reader never sees half a file and a failure leaves the
old one: write beside the target, then rename. The one helper for toolbox's outputs."""

from __future__ import annotations

import errno
import os
import stat
import tempfile
from pathlib import Path

from toolbox.errors import ToolError, UserError


def write_error(path: Path, exc: OSError) -> Exception:
    """The error a failed write of `path` becomes: a full disk or an I/O error is a fault."""
    if exc.errno in (errno.ENOSPC, errno.EDQUOT, errno.EIO):
        return ToolError(f"{path}: cannot write: {exc.strerror}; nothing was changed")
    return UserError(f"{path}: cannot write: {exc.strerror}")


def _write_stream(path: Path, data: bytes) -> Path:
    """/dev/stdout, /dev/null, a FIFO with a reader: written in place (renaming a file over a
    device would replace the device). A FIFO nobody reads is refused, not waited on for ever."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
    except OSError as exc:
        if exc.errno == errno.ENXIO:
            raise UserError(f"{path}: a FIFO that nobody reads; --output names a file") from None
        raise write_error(path, exc) from None
    try:
        os.set_blocking(fd, True)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
    except OSError as exc:
        raise write_error(path, exc) from None
    return path


def atomic_write(path: Path, text: str | bytes, mode: int = 0o644) -> Path:
    path = Path(path)
    data = text.encode("utf-8") if isinstance(text, str) else text
    try:
        st = path.stat()
    except OSError:
        st = None  # a new file (or a dangling link: replaced like a new file)
    if st is not None:
        if stat.S_ISDIR(st.st_mode):
            raise UserError(f"{path}: is a directory; --output names a file")
        if stat.S_ISCHR(st.st_mode) or stat.S_ISFIFO(st.st_mode):
            return _write_stream(path, data)
        if not stat.S_ISREG(st.st_mode):
            raise UserError(f"{path}: not a regular file; --output names a file")
        if path.is_symlink():
            path = Path(os.path.realpath(path))  # the file the link names is replaced; the link stays
    parent = path.parent if str(path.parent) else Path(".")
    if not parent.is_dir():
        raise UserError(f"{path}: folder {parent} does not exist")
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=parent)
    except OSError as exc:
        raise write_error(path, exc) from None
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())  # the bytes are on disk before the name points at them
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except OSError as exc:
        Path(tmp).unlink(missing_ok=True)
        raise write_error(path, exc) from None
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path
