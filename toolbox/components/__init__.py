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
- `variables(stack, pin_set) -> dict`: template variables its own templates use. Names must not
  clash with another component's (render refuses a clash); `stack`, `lock_digest`, `builders`,
  `runtimes` and `exports` are render's own.
- `context(stack) -> [ContextFile]`: what it puts into the build context besides the
  Dockerfile and stack.lock.yaml (files or folders copied, templates rendered, empty folders).
- `exports(stack) -> dict`: named values other components' templates (and render's own stages)
  read, as `exports.<name>.<key>` (rocm's `prefix`, base's `family`, torch's `reqs`): a template
  reads its own block and variables, the stack's own fields and these, never another component's
  block or variables (tests/test_component_hooks.py).

Its lifecycle beyond the image, each hook optional, each asked by one generic module that names
no component (the hooks receive the tools they need: this package imports nothing of the stack):
- `lock(stack) -> LockPart`: what it adds to the stack's Python lock (toolbox.stack.python_lock).
- `interpreter(stack) -> "3.12"`: the Python the image's venv is made with (the base's).
- `bumps`: {target: hook(stack, to, tools) -> changes}: what `toolbox bump TARGET` does for it
  (toolbox.stack.bumping; `git_bump` for a block pinned by a git commit).
- `first_use_pins(stack, pinner) -> [(field path, value)]`: what it pins on first use
  (toolbox.stack.pinning), in `pin_place` order (default `place`).
- `checks(model)`: what it asks of the stack and the blocks it depends on, run when the stack
  model is validated where its block is set (toolbox.stack.model; raise values.FieldError).

Adding a component: a module here with those hooks and its block, and its templates; the
registry finds every module here that defines COMPONENT (tests/test_component_hooks.py adds one). The order (`place`) is by how often the
pins change (ROCm first, Unsloth/HF last, labels at the very end), so a bump of a late pin
reuses every earlier layer.

This package is below toolbox.stack: it imports nothing of it (the stack model imports the
blocks, the loader collects the pins). The `stack` each hook receives is the resolved stack
(toolbox.stack.resolved.Stack) and `pin_set` its toolbox.stack.digest.PinSet; `lock` and
`first_use_pins` get it before its pins are collected (`stack.pin_set` is None then).
"""

from __future__ import annotations

import importlib
import pkgutil
import re
from dataclasses import dataclass, field as _field
from functools import cache
from pathlib import Path
from typing import Any, Callable, Mapping

from pydantic import BaseModel, ConfigDict

from toolbox.errors import UserError

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
class LockPart:
    """What one component adds to the stack's Python lock (toolbox.stack.python_lock):
    `requirements`: pinned, resolved into the lock; `first_use`: {requirement: note}: from an index
    only the user's network reaches, left out of the resolution and named in the lock's header
    with the note; `left_out`: {name: why}: what its wheels require that the image takes elsewhere;
    `index_url`: an extra index the resolution asks; `local_wheels`: whether a --find-links wheel
    may stand in for its pins; `first`: the package whose closure the image installs first, from
    its own part of the lock (its own inputs digest: that layer stays cached while later pins
    move); `own_layer`: the package what only it pulls in is a layer of its own after the rest;
    `hint`: said when the resolution fails and `index_url` was asked."""

    requirements: tuple[str, ...] = ()
    first_use: Mapping[str, str] = _field(default_factory=dict)
    left_out: Mapping[str, str] = _field(default_factory=dict)
    index_url: str | None = None
    local_wheels: bool = True
    first: str | None = None
    own_layer: str | None = None
    hint: str = ""


@dataclass(frozen=True)
class NewStack:
    """A bump hook's answer when it wrote a new stack file instead of editing this one."""

    result: dict


Bumper = Callable[["Stack", "str | None", Any], "dict[str, object] | NewStack"]


def git_bump(block: str, repo_field: str = "repo", commit_field: str = "commit", *, unverified: bool = True,
             tag_version: str | None = None) -> Bumper:
    """The bump of a block pinned by a git commit: `--to TAG|BRANCH` (default the remote's HEAD)
    resolved to its 40-hex commit; `tag_version`: the field a release tag (vX.Y.Z) also sets."""

    def run(stack: "Stack", to: str | None, tools: Any) -> dict[str, object]:
        obj = stack.model
        for part in block.split("."):
            obj = getattr(obj, part, None) if obj is not None else None
        if obj is None:
            raise UserError(f"{tools.path}: {block}: this stack has no such block")
        if getattr(obj, "source", "git") != "git":
            raise UserError(f"{tools.path}: {block}: source is {obj.source}, not git: no commit to bump (edit its "
                            f"version, then `toolbox lock --stack {stack.model.name}`)")
        changes: dict[str, object] = {f"{block}.{commit_field}": tools.git(getattr(obj, repo_field), to)}
        if tag_version and to and re.fullmatch(r"v?\d+\.\d+\.\d+", to):
            # a release tag: the wheel the image builds carries that version (its install step names it)
            changes[tag_version] = to.lstrip("v")
        if hasattr(obj, "unverified") and unverified:
            changes[f"{block}.unverified"] = False
        return changes

    return run


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
    exports: Callable[["Stack"], dict[str, Any]] = _none
    lock: Callable[["Stack"], LockPart] | None = None
    interpreter: Callable[["Stack"], str] | None = None
    bumps: Mapping[str, Bumper] = _field(default_factory=dict)
    first_use_pins: Callable[["Stack", Any], list[tuple[tuple[str, ...], Any]]] | None = None
    pin_place: int | None = None  # first-use pins are taken in this order; None: `place`
    checks: Callable[[Any], None] | None = None  # (stack model) its checks across blocks; FieldError

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
    exports: dict[str, Any]


def parts(stack: "Stack") -> list[Part]:
    """Every active component's contribution, in order: one pass over the components for render
    (the pins are the other, when the stack is resolved: the digest comes before the variables)."""
    out = []
    for c in registry():
        if not c.applies(stack):
            continue
        builds = c.builder is not None and c.builds(stack)
        out.append(Part(c, c.builder if builds else None, builds and c.needs_devel(stack),
                        c.variables(stack, stack.pin_set), c.context(stack), c.exports(stack)))
    return out


def pins(stack: "Stack") -> dict[str, str]:
    """Every active component's pins, sorted: what the stack's digest is computed from."""
    out: dict[str, str] = {}
    for comp in active(stack):
        out.update(comp.pins(stack))
    return dict(sorted(out.items()))


def lock_parts(stack: "Stack") -> list[LockPart]:
    """What every active component adds to the Python lock, in image order."""
    return [c.lock(stack) for c in active(stack) if c.lock is not None]


def python_version(stack: "Stack") -> str:
    """The Python the image's venv is made with ("3.12"): the active component that knows it."""
    found = next((c for c in active(stack) if c.interpreter is not None), None)
    if found is None:
        raise LookupError(f"stack {stack.model.name}: no component says which Python the image has")
    return found.interpreter(stack)


def bump_targets() -> dict[str, Bumper]:
    """Every `toolbox bump` target, by name, from the components' `bumps` (a name given twice is refused)."""
    out: dict[str, Bumper] = {}
    for c in registry():
        for name, hook in c.bumps.items():
            if name in out:
                raise LookupError(f"component {c.name}: bump target {name!r} is another component's")
            out[name] = hook
    return dict(sorted(out.items()))


def pinners(stack: "Stack") -> list[Component]:
    """The active components that pin something on first use, in the order they pin."""
    found = [c for c in active(stack) if c.first_use_pins is not None]
    return sorted(found, key=lambda c: c.place if c.pin_place is None else c.pin_place)
