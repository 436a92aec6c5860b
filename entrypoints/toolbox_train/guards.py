"""Checks of the paths and files a training command is given (flags, config fields), made before
anything is read or written: a NUL byte or a name over the OS limits is refused as the input it
is, and a FIFO, device or socket is never opened (reading a FIFO blocks until a writer comes)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from toolbox_train.contract import UserError


def _limit(name: str, default: int) -> int:
    try:
        return os.pathconf("/", name)
    except (OSError, ValueError):
        return default


NAME_MAX = _limit("PC_NAME_MAX", 255)  # bytes in one path component
PATH_MAX = _limit("PC_PATH_MAX", 4096)  # bytes in a whole path, its terminating NUL included


def path_problem(text: str) -> str | None:
    """Why `text` cannot name a file on this OS (None when it can)."""
    if not text:
        return "empty (it would name the current folder)"
    if "\x00" in text:
        return "contains a NUL byte"
    raw = os.fsencode(text)
    if len(raw) >= PATH_MAX:
        return f"{len(raw)} bytes long; the OS limit is {PATH_MAX - 1}"
    longest = max(raw.split(b"/"), key=len)
    if len(longest) > NAME_MAX:
        return f"a name of {len(longest)} bytes ({longest[:24].decode(errors='replace')}...); the OS limit is {NAME_MAX}"
    return None


def check_path(text: str, what: str) -> Path:
    """`text` as a Path, or UserError naming `what` (a flag or a config field)."""
    why = path_problem(text)
    if why:
        raise UserError(f"{what}: {text[:80]!r}{'...' if len(text) > 80 else ''}: {why}")
    return Path(text)


def special_file(path: Path) -> str | None:
    """'a FIFO' (device, socket) when `path` (followed through links) is neither a regular file
    nor a folder, else None; stat() never blocks, where open() on a FIFO would."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return None
    if stat.S_ISREG(mode) or stat.S_ISDIR(mode):
        return None
    if stat.S_ISFIFO(mode):
        return "a FIFO (named pipe)"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "a device"


def regular_file(text: str | Path, what: str) -> Path:
    """The file `what` names: it exists and is a regular file (never a FIFO, device or folder)."""
    path = check_path(str(text), what)
    kind = special_file(path)
    if kind:
        raise UserError(f"{what} {path}: {kind}, not a regular file (it is not read)")
    if path.is_dir():
        raise UserError(f"{what} {path}: a folder, not a file")
    if not path.is_file():
        raise UserError(f"{what} {path}: no such file")
    return path


def unwritable(folder: Path) -> str | None:
    """Why nothing can be made in `folder` (a read-only file system, no permission), or None.
    access(2) answers for the caller as it is: root passes mode bits, never a read-only mount."""
    if os.access(folder, os.W_OK | os.X_OK):
        return None
    try:
        if os.statvfs(folder).f_flag & os.ST_RDONLY:
            return f"{folder} is on a read-only file system"
    except OSError:
        pass
    return f"{folder} is not writable (permission denied)"


def cannot_make(folder: Path) -> str | None:
    """Why the folder `folder` (not there yet) could not be made, or None: the nearest existing
    path above it is a file, or a folder nothing can be made in."""
    above = folder.parent
    while not above.exists() and not above.is_symlink() and above != above.parent:
        above = above.parent
    if not above.is_dir():
        return f"{above} is {'a file' if above.exists() else 'a link to nothing'}, not a folder"
    why = unwritable(above)
    return f"cannot be made: {why}" if why else None
