"""Every console script can be run by its name from a shell, and the image ships the host's training ones."""

from __future__ import annotations

import subprocess
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def scripts(pyproject: Path) -> dict[str, str]:
    return tomllib.loads(pyproject.read_text())["project"]["scripts"]


HOST = scripts(ROOT / "pyproject.toml")
IMAGE = scripts(ROOT / "entrypoints" / "pyproject.toml")


@pytest.mark.parametrize("name", sorted(HOST))
def test_name_is_not_taken_by_the_shell(name):
    # `export`, `test`, `time`... are resolved by the shell before PATH: such a command never runs.
    for shell in ("/bin/bash", "/bin/sh"):
        kind = subprocess.run([shell, "-c", f"command -V {name} 2>&1 || true"], capture_output=True,
                              text=True, env={"PATH": "/nonexistent"}).stdout
        assert "builtin" not in kind and "keyword" not in kind, f"{shell}: {kind.strip()}"


def test_image_ships_the_same_training_commands():
    assert IMAGE == {k: v for k, v in HOST.items() if k != "toolbox"}
