"""Real small file systems for tests of a full disk or a read-only folder: tmpfs mounts, which
need root (as CI runs). Elsewhere the test is skipped; in CI (CI=true) it fails instead."""

from __future__ import annotations

import os
import shutil
import subprocess
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import pytest

IN_CI = os.environ.get("CI") == "true"  # the rule of helpers/enginekit.py


@contextmanager
def tmpfs(folder: Path, size: str = "1m") -> Iterator[Path]:
    """`folder` with a tmpfs of `size` mounted on it, unmounted afterwards (`read_only(folder)`
    turns it read-only once the test has filled it)."""
    if os.geteuid() != 0 or shutil.which("mount") is None:
        msg = "a tmpfs mount needs root and mount(8)"
        if IN_CI:
            pytest.fail(msg)
        pytest.skip(msg)
    folder.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder)], check=True)
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], check=False)


def read_only(folder: Path) -> None:
    subprocess.run(["mount", "-o", "remount,ro", str(folder)], check=True)


def resize(folder: Path, size: str) -> None:
    """Grow (or shrink) the tmpfs on `folder`, its files kept: the disk freed up."""
    subprocess.run(["mount", "-o", f"remount,size={size}", str(folder)], check=True)
