"""Loading a stack: the shipped stacks by name, a file by path, `--set` overrides.

A stack is validated by the pydantic models of toolbox.stack.model, which forbid unknown keys,
so a typo such as `rocm.verison` is an error naming the file, the field path and the line
(toolbox.stack.source keeps the lines). A user's file can `extends:` a shipped stack;
`--set key.path=value` overrides go through the same validation. `load_stack` returns the
resolved `Stack` (toolbox.stack.resolved) with its digest (toolbox.stack.digest) computed from
the components' pins, once: a build's first-use pins (`first_use`, typed updates) are applied
before (validated again, with no file read or `--set` text parsed a second time).
"""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Sequence

from pydantic import ValidationError

from toolbox import components
from toolbox.errors import UserError
from toolbox.paths import DEFAULT_STACK, STACKS_DIR
from toolbox.stack import digest, python_lock
from toolbox.stack.source import Origin, apply_overrides, apply_values, format_errors, load_raw
from toolbox.stack.model import StackModel
from toolbox.stack.resolved import Stack

if TYPE_CHECKING:
    from toolbox.stack.pinning import PinUpdate


def stack_names() -> list[str]:
    return sorted(p.stem for p in STACKS_DIR.glob("*.yaml"))


def resolve_ref(ref: str | None, relative_to: Path | None = None) -> Path:
    ref = ref or DEFAULT_STACK
    if re.match(r"^[a-z0-9][a-z0-9._-]*$", ref) and (STACKS_DIR / f"{ref}.yaml").is_file():
        return STACKS_DIR / f"{ref}.yaml"
    p = Path(ref)
    if relative_to is not None and not p.is_absolute():
        p = relative_to / p
    if p.is_file():
        return p
    raise UserError(f"no stack {ref!r}: neither a shipped stack ({', '.join(stack_names())}) nor a file")


def load_stack(ref: str | None = None, overrides: Sequence[str] = (),
               first_use: Callable[[Stack], Sequence["PinUpdate"]] | None = None) -> Stack:
    """The stack read, validated and resolved once. `first_use(stack)` (toolbox build's) is called
    when the stack is validated and its Python lock read (`stack.python_lock`), before its pins
    are collected (`stack.pin_set` is None then): the pin updates it returns are applied first."""
    path = resolve_ref(ref)
    origin = Origin()
    raw = load_raw(path, origin, lambda parent, folder: resolve_ref(parent, relative_to=folder))
    files_only = copy.deepcopy(raw) if overrides else None
    apply_overrides(raw, overrides, origin)
    try:
        return _resolve(raw, origin, path.resolve(), first_use)
    except UserError as exc:
        culprit = _culprit(files_only, overrides) if overrides and not str(exc).startswith("--set ") else None
        if culprit is None:
            raise
        # the files held; the --set broke a field it did not name (platform=cuda leaves `rocm:`
        # without its platform): blame the --set, with the field's place in the file after it
        lines = [re.sub(r"^(\S+?:\d+): (.*)$", r"\2 (\1)", line) for line in str(exc).splitlines()]
        raise UserError(f"--set {culprit}: " + "; ".join(lines)) from None


def _culprit(files_only: dict, overrides: Sequence[str]) -> str | None:
    """The first --set after which the stack no longer validates (None: the files alone fail)."""
    try:
        StackModel.model_validate(files_only)
    except ValidationError:
        return None
    for n, text in enumerate(overrides, 1):
        raw = copy.deepcopy(files_only)
        apply_overrides(raw, overrides[:n], Origin())
        try:
            StackModel.model_validate(raw)
        except ValidationError:
            return text
    return None


def with_pins(stack: Stack, updates: Sequence["PinUpdate"]) -> Stack:
    """A resolved stack with first-use pins set, resolved again (a build gives its pins to
    load_stack instead, and resolves once)."""
    pinned = _pinned(stack, updates)
    pinned.pin_set = digest.compute(pinned.model, components.pins(pinned))
    return pinned


def _pinned(stack: Stack, updates: Sequence["PinUpdate"]) -> Stack:
    """The stack with first-use pins set (toolbox.stack.pinning's typed updates), validated again;
    its patch series and Python lock state kept: a first-use pin is a hash, a digest or a commit,
    none of what the lock is made from (tests/test_pinning.py holds it)."""
    raw, origin = copy.deepcopy(stack.raw), copy.deepcopy(stack.origin)
    apply_values(raw, [(u.path, u.value) for u in updates], origin, "first-use pin")
    pinned = Stack(_validate(raw, origin), stack.source, origin, raw, derived_from=stack)
    pinned.python_lock = stack.python_lock
    return pinned


def _validate(raw: dict, origin: Origin) -> StackModel:
    try:
        return StackModel.model_validate(raw)
    except ValidationError as exc:
        raise UserError(format_errors(exc, origin)) from None


def _resolve(raw: dict, origin: Origin, source: Path, first_use=None) -> Stack:
    try:
        model = StackModel.model_validate(raw)
    except ValidationError as exc:
        raise UserError(format_errors(exc, origin)) from None
    stack = Stack(model, source, origin, raw)
    stack.python_lock = python_lock.state(stack)  # once: the lock component, the pins and `build`'s check read it
    updates = first_use(stack) if first_use else ()
    if updates:
        stack = _pinned(stack, updates)
    stack.pin_set = digest.compute(stack.model, components.pins(stack))  # once, with the first-use pins
    return stack
