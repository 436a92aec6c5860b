"""The stack's digest: every pin of a stack, their digest and its unverified pins, once per stack.

`toolbox.stack.load.load_stack` computes it when the stack is loaded (the patch series is
hashed then, once) from the components' pins, and the Stack carries it; components receive it
as an argument instead of asking the stack back. It reads only the stack model: nothing here
imports the components or the resolved stack.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import yaml
from pydantic import BaseModel

if TYPE_CHECKING:
    from toolbox.stack.model import StackModel


@dataclass(frozen=True)
class PinSet:
    """Every pin of a stack, their digest and the pins marked unverified."""

    pins: dict[str, str]
    digest: str  # 12 hex: the image tag (and the image's io.github.toolbox.lock-digest label)
    unverified: tuple[str, ...]


def unverified_paths(model: BaseModel) -> list[str]:
    """Field paths of every block marked `unverified: true`."""
    out: list[str] = []

    def walk(obj: Any, path: str) -> None:
        if isinstance(obj, BaseModel):
            if getattr(obj, "unverified", False):
                out.append(path)
            for name in type(obj).model_fields:
                walk(getattr(obj, name), f"{path}.{name}" if path else name)

    walk(model, "")
    return sorted(out)


def compute(model: "StackModel", pins: dict[str, str]) -> PinSet:
    """The digest of the stack's pins (toolbox.components.pins(stack) collects them)."""
    pins = dict(sorted(pins.items()))
    blob = json.dumps({"stack": model.name, "pins": pins}, sort_keys=True).encode()
    return PinSet(pins=pins, digest=hashlib.sha256(blob).hexdigest()[:12],
                unverified=tuple(unverified_paths(model)))


def document(model: "StackModel", pin_set: PinSet) -> str:
    """stack.lock.yaml, as the image ships it in /opt/toolbox/."""
    doc = {
        "stack": model.name,
        "platform": model.platform,
        "base_image": model.base.ref,
        "lock_digest": pin_set.digest,  # the key the image's doctor reads
        "pins": dict(pin_set.pins),
        "unverified": list(pin_set.unverified),
    }
    return yaml.safe_dump(doc, sort_keys=True, default_flow_style=False)
