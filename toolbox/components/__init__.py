"""Components: one module per installed thing (ROCm, RCCL, torch, ...), each owning all of it.

`toolbox.render` knows no component by name: it loops over `active(stack)` and collects what
each one contributes through the hooks below (the shape of hpc-container-maker's building
blocks, which own their build steps and their runtime copy, and of repo2docker's build packs,
whose `get_packages`/`get_env`/`get_build_script_files` hooks one generic `render()` collects).

A component module defines `COMPONENT = Component(...)` with:

- `name`: the block of the stack it installs (also what ORDER and messages call it).
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

Adding a component: a module here with those hooks, its templates, its block in
toolbox/stack/model.py, and its place in ORDER. ORDER is by how often the pins change (ROCm
first, Unsloth/HF last, labels at the very end), so a bump of a late pin reuses every earlier
layer.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

if TYPE_CHECKING:  # neither imports toolbox.components: no circle
    from toolbox.stack.digest import PinSet
    from toolbox.stack.resolved import Stack


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
    applies: Callable[["Stack"], bool]
    pins: Callable[["Stack"], dict[str, str]] = _none
    builder: str | None = None
    runtime: str | None = None
    builds: Callable[["Stack"], bool] = lambda s: True
    needs_devel: Callable[["Stack"], bool] = lambda s: False
    variables: Callable[["Stack", "PinSet"], dict[str, Any]] = _none
    context: Callable[["Stack"], list[ContextFile]] = lambda s: []


ORDER = ("base", "rocm", "rccl", "torch", "bitsandbytes", "hf", "unsloth", "llama_cpp", "ray", "entrypoints", "pylock",
         "labels")


def _all() -> list[Component]:
    import importlib

    return [importlib.import_module(f"toolbox.components.{name}").COMPONENT for name in ORDER]


def active(stack: "Stack") -> list[Component]:
    return [c for c in _all() if c.applies(stack)]


@dataclass(frozen=True)
class Part:
    """What one active component gives the image, each of its hooks asked once (render collects these)."""

    component: Component
    builder: str | None  # its builder stage's template, where this stack needs that stage
    needs_devel: bool
    variables: dict[str, Any]
    context: list[ContextFile]


def parts(stack: "Stack") -> list[Part]:
    """Every active component's contribution, in ORDER: one pass over the components for render
    (the pins are the other, when the stack is resolved: the digest comes before the variables)."""
    out = []
    for c in _all():
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
