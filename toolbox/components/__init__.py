"""Components: one module per installed thing (ROCm, RCCL, torch, ...), each owning all of it.

`toolbox.rendering` knows no component by name: it loops over `active(stack)` and collects what
each one contributes through the hooks below (the shape of hpc-container-maker's building
blocks, which own their build steps and their runtime copy, and of repo2docker's build packs,
whose `get_packages`/`get_env`/`get_build_script_files` hooks one generic `render()` collects).

A component module defines `COMPONENT = Component(...)` with:

- `name`: what messages call it (also the stack block's key, unless `key` names another).
- `place`: its place in the image's order (lower: earlier); `registry()` sorts by it.
- `block`: the pydantic model of its stack block (`key:` in the YAML), a `Model` declared in the
  component's module, and `field`: that block's pydantic Field (default, description); the stack
  model (toolbox.stack.model) composes every component's block. None: the component has no block.
- `applies(stack) -> bool`: whether the stack uses it; only active components contribute.
- `pins(stack) -> {pin: value}`: its entries in the stack's pins (`toolbox.stack.digest`);
  every value that changes what gets built must be a pin, since their digest tags the image.
- `builder`: a template under dockerfiles/ rendering its builder stage (sources and compilers
  stay there), and `builds(stack) -> bool` when that stage is only sometimes needed.
- `runtime`: a template rendering its steps in the runtime stage (copying builder results in).
- `needs_devel(stack) -> bool`: its builder stage starts `FROM devel` (compilers); render puts
  the shared devel stage right before the first builder stage that needs it.
- `variables(stack, pin_set) -> dict`: template variables its templates use. Names must not clash
  with another component's (render refuses a clash); `stack`, `lock_digest`, `builders` and
  `runtimes` are render's own.
- `context(stack) -> [ContextFile]`: what it puts into the build context besides the
  Dockerfile and stack.lock.yaml (files or folders copied, templates rendered, empty folders).

Adding a component: a module here with those hooks and its block, and its templates; the
registry finds every module here that defines COMPONENT. The order (`place`) is by how often the
pins change (ROCm first, Unsloth/HF last, labels at the very end), so a bump of a late pin
reuses every earlier layer.

This package is below toolbox.stack: it imports nothing of it (the stack model imports the
blocks, the loader collects the pins). The `stack` each hook receives is the resolved stack
(toolbox.stack.resolved.Stack) and `pin_set` its toolbox.stack.digest.PinSet.
"""

from __future__ import annotations

import importlib
import pkgutil
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any, Callable

from pydantic import BaseModel, ConfigDict

Stack = Any  # the resolved stack (toolbox.stack.resolved.Stack: above this package, not imported)
PinSet = Any  # its pins and digest (toolbox.stack.digest.PinSet)


class Model(BaseModel):
    """A stack block's model: unknown keys refused, frozen."""

    model_config = ConfigDict(extra="forbid", frozen=True)


@dataclass(frozen=True)
class ContextFile:
    """One entry of the build context: `dest` (a path inside it) from at most one of
    `src` (a file or folder, copied; folders merge), `template` (a path under dockerfiles/,
    rendered with the stack), `text` (the file's content); none of them: an empty folder."""

    dest: str
    src: Path | None = None
    template: str | None = None
    text: str | None = None


def _none(*_a: Any) -> dict:
    return {}


@dataclass(frozen=True)
class Component:
    name: str
    place: int
    applies: Callable[["Stack"], bool]
    pins: Callable[["Stack"], dict[str, str]] = _none
    builder: str | None = None
    runtime: str | None = None
    builds: Callable[["Stack"], bool] = lambda s: True
    needs_devel: Callable[["Stack"], bool] = lambda s: False
    variables: Callable[["Stack", "PinSet"], dict[str, Any]] = _none
    context: Callable[["Stack"], list[ContextFile]] = lambda s: []
    block: type[Model] | None = None
    field: Any = None  # pydantic's Field(default, description=...) of the block in the stack
    key: str | None = None  # the block's key in the stack; None: `name`

    @property
    def block_key(self) -> str:
        return self.key or self.name


@cache
def registry() -> tuple[Component, ...]:
    """Every module of this package that defines COMPONENT, in image order (by place)."""
    found = (importlib.import_module(f"{__name__}.{m.name}") for m in pkgutil.iter_modules(__path__))
    return tuple(sorted((m.COMPONENT for m in found if hasattr(m, "COMPONENT")), key=lambda c: c.place))


def active(stack: "Stack") -> list[Component]:
    return [c for c in registry() if c.applies(stack)]


@dataclass(frozen=True)
class Part:
    """What one active component gives the image, each of its hooks asked once (render collects these)."""

    component: Component
    builder: str | None  # its builder stage's template, where this stack needs that stage
    needs_devel: bool
    variables: dict[str, Any]
    context: list[ContextFile]


def parts(stack: "Stack") -> list[Part]:
    """Every active component's contribution, in order: one pass over the components for render
    (the pins are the other, when the stack is resolved: the digest comes before the variables)."""
    out = []
    for c in registry():
        if not c.applies(stack):
            continue
        builds = c.builder is not None and c.builds(stack)
        out.append(Part(c, c.builder if builds else None, builds and c.needs_devel(stack),
                        c.variables(stack, stack.pin_set), c.context(stack)))
    return out


def pins(stack: "Stack") -> dict[str, str]:
    """Every active component's pins, sorted: what the stack's digest is computed from."""
    out: dict[str, str] = {}
    for comp in active(stack):
        out.update(comp.pins(stack))
    return dict(sorted(out.items()))
