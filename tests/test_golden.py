"""Golden Dockerfiles per shipped stack. Refresh after an intended change: `make golden`."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from toolbox.rendering import render_dockerfile
from toolbox.stack.load import load_stack, stack_names

GOLDEN = Path(__file__).resolve().parent / "golden"


@pytest.mark.parametrize("name", stack_names())
def test_golden(name):
    text = render_dockerfile(load_stack(name))
    path = GOLDEN / f"{name}.Dockerfile"
    if os.environ.get("TOOLBOX_UPDATE_GOLDEN") == "1":
        GOLDEN.mkdir(exist_ok=True)
        path.write_text(text, encoding="utf-8")
    assert path.is_file(), f"{path} missing: run `make golden`"
    assert text == path.read_text(encoding="utf-8"), f"{name} render changed: review, then `make golden`"
