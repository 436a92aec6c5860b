"""Writing to disk, for the training commands and the host alike: the one durable atomic write (a
reader - another node, a resumed run, `bench render`, a build - sees the old file or the new one,
never half of one, and a power cut leaves no zero-length file under the new name), the one way a
folder is published whole (`publish_folder`), and the error a failed write becomes."""

from __future__ import annotations

import errno
import json
import os
import shutil
import stat
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

from toolbox_train.contract import MACHINE_ERRNOS, ToolError, UserError, disk_full  # noqa: F401 (disk.disk_full)


def write_error(path: Path, exc: OSError) -> Exception:
    """The error a failed write of `path` becomes: a fault of the machine (contract.MACHINE_ERRNOS:
    a full disk, a read-only or failed file system) is a ToolError (exit 1), else bad input (exit 2)."""
    if exc.errno in MACHINE_ERRNOS:
        return ToolError(f"{path}: cannot write: {exc.strerror}; nothing was changed")
    return UserError(f"{path}: cannot write: {exc.strerror}")


def _write_stream(path: Path, data: bytes) -> Path:
    """/dev/stdout, /dev/null, a FIFO with a reader: written in place (renaming a file over a
    device would replace the device). A FIFO nobody reads is refused, not waited on for ever."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
    except OSError as exc:
        if exc.errno == errno.ENXIO:
            raise UserError(f"{path}: a FIFO that nobody reads; name a file") from None
        raise write_error(path, exc) from None
    try:
        os.set_blocking(fd, True)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
    except OSError as exc:
        raise write_error(path, exc) from None
    return path


def fsync_dir(folder: Path) -> None:
    """Make a rename (or a new name) in `folder` survive a power cut: the folder's entry is on disk."""
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write(path: Path, data: str | bytes, mode: int = 0o644, parents: bool = True) -> Path:
    """Write `data` (text as UTF-8) to `path` whole or not at all: a unique temp file beside it,
    written, flushed and fsynced, renamed over `path`, then the folder fsynced. A link is followed
    (the file it names is replaced, the link stays); a device or a FIFO is written in place; a
    folder is refused. `parents`: create a missing folder (else a UserError names it). A failed
    write leaves the old file and no temp file, and raises write_error's error."""
    path = Path(path)
    data = data.encode("utf-8") if isinstance(data, str) else data
    try:
        st = path.stat()
    except OSError:
        st = None  # a new file (or a dangling link: replaced like a new file)
    if st is not None:
        if stat.S_ISDIR(st.st_mode):
            raise UserError(f"{path}: is a directory, not a file")
        if stat.S_ISCHR(st.st_mode) or stat.S_ISFIFO(st.st_mode):
            return _write_stream(path, data)
        if not stat.S_ISREG(st.st_mode):
            raise UserError(f"{path}: not a regular file")
        if path.is_symlink():
            path = Path(os.path.realpath(path))
    parent = path.parent if str(path.parent) else Path(".")
    try:
        if parents:
            parent.mkdir(parents=True, exist_ok=True)
        elif not parent.is_dir():
            raise UserError(f"{path}: folder {parent} does not exist")
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=parent)
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
    try:
        fsync_dir(parent)  # the new name is on disk too
    except OSError as exc:
        if exc.errno not in (errno.EINVAL, errno.ENOTSUP):  # a file system that cannot fsync a folder
            raise ToolError(f"{path}: written, but its folder could not be synced: {exc.strerror}") from None
    return path


def write_json(path: Path, obj: Any) -> Path:
    return atomic_write(path, json.dumps(obj, indent=2, default=str) + "\n")


def remove(path: Path) -> None:
    """A file or a folder with what it holds; a link alone (never what it points to)."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink()


@contextmanager
def publish_folder(dest: Path) -> Iterator[Path]:
    """A fresh folder beside `dest` (`.NAME.partial-PID`, what export/llamacpp.py tells users of) to
    fill. When the block ends, it takes `dest`'s place in one rename: a `dest` already there is set
    aside first and removed once the new one is in. When the block raises (a tool failing, a full
    disk, SIGTERM), the partial folder goes and `dest` is left as it was (put back if it was set
    aside). Checkpoints publish their own way: another node may have published the same step
    (runs/checkpoints.publish)."""
    tmp = dest.parent / f".{dest.name}.partial-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    old = None
    try:
        yield tmp
        if dest.exists():
            old = dest.parent / f".{dest.name}.old-{os.getpid()}"
            os.replace(dest, old)
        os.replace(tmp, dest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        if old is not None and old.exists() and not dest.exists():
            os.replace(old, dest)  # what was there before, back as it was
        raise
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
