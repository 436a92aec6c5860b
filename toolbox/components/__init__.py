"""One module per installed thing. Each contributes template partials, pins and labels.

A component's `builder` partial renders a builder stage (compilers and sources stay there);
its `runtime` partial renders the steps of the runtime stage, where builder stages' results
are copied in. ORDER is by how often the pins change (ROCm first, Unsloth/HF last, labels
at the very end), so a bump of a late pin reuses every earlier layer.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

if TYPE_CHECKING:
    from toolbox.stack import Stack


@dataclass(frozen=True)
class Component:
    name: str
    applies: Callable[["Stack"], bool]
    pins: Callable[["Stack"], dict[str, str]]
    builder: str | None = None
    runtime: str | None = None


def _order() -> list[Component]:
    from toolbox.components import (
        base, bitsandbytes, entrypoints, hf, labels, rccl, rocm, torch, unsloth,
    )

    return [m.COMPONENT for m in (base, rocm, rccl, torch, bitsandbytes, hf, unsloth, entrypoints, labels)]


def active(stack: "Stack") -> list[Component]:
    return [c for c in _order() if c.applies(stack)]
