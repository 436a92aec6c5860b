"""The one parser of the gradient-sync mode: `launch --sync` and the TOOLBOX_SYNC environment
variable it hands to the ranks (`every-step`, or `local-sgd:K` to average parameters every K
optimizer steps)."""

from __future__ import annotations

import os

from toolbox_train.contract import UserError

ENV = "TOOLBOX_SYNC"
DEFAULT = "every-step"


def parse_sync(value: str, source: str = "--sync") -> str:
    """The normalized mode (`every-step` or `local-sgd:K`); UserError naming `source` otherwise."""
    if value == DEFAULT:
        return DEFAULT
    k = value.split(":", 1)[1] if value.startswith("local-sgd:") else ""
    if not k.isdigit() or int(k) < 1:
        raise UserError(f"{source} {value!r}: expected every-step or local-sgd:K with K >= 1")
    return f"local-sgd:{int(k)}"


def local_sgd_steps(mode: str) -> int:
    """K of `local-sgd:K`; 0 for every-step."""
    return int(mode.split(":", 1)[1]) if mode.startswith("local-sgd:") else 0


def from_env() -> str:
    return parse_sync(os.environ.get(ENV) or DEFAULT, source=ENV)
