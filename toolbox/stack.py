"""Stacks: the YAML files of pins that a Dockerfile is rendered from.

A stack is validated by the pydantic models of toolbox.stack_model, which forbid unknown keys,
so a typo such as `rocm.verison` is an error naming the file, the field path and the line
(toolbox.stack_loader keeps the lines). A user's file can `extends:` a shipped stack;
`--set key.path=value` overrides go through the same validation. `load_stack` returns the
resolved `Stack`: the model plus what is derived from it (patch files found, the lock).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Sequence

from pydantic import ValidationError

from toolbox import lock as lockmod
from toolbox.errors import UserError
from toolbox.rccl.patches import MissingPatch, Series, parse_series
from toolbox.stack_loader import Origin, apply_overrides, format_errors, load_raw
# Re-exported: callers import the schema from here.
from toolbox.stack_model import (  # noqa: F401
    COMMIT_RE, DIGEST_RE, KNOWN_GPU_TARGETS, SHA256_RE, VERSION_RE, StackModel,
)

PACKAGE_DIR = Path(__file__).resolve().parent
STACKS_DIR = PACKAGE_DIR / "stacks"
PROJECT_ROOT = PACKAGE_DIR.parent
DEFAULT_STACK = "gfx1151"


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


class Stack:
    """A validated stack and what is derived from it: patch files (checked), the lock."""

    def __init__(self, model: StackModel, source: Path, origin: Origin):
        self.model = model
        self.source = source
        self.origin = origin
        self.rccl_series: Series | None = self._rccl_series()
        self.unsloth_patches = self._unsloth_patch_files()
        self.locked: lockmod.Lock = lockmod.compute(self)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.model, name)

    @property
    def rccl_targets(self) -> list[str]:
        r = self.model.rccl
        return [] if r is None else (r.gpu_targets if r.gpu_targets is not None else self.model.gpu_targets)

    @property
    def base_image(self) -> str:
        return self.model.base.ref

    @property
    def rccl_patch_dir(self) -> Path | None:
        return None if self.rccl_series is None else self.rccl_series.path.parent

    def _local(self, ref: str) -> list[Path]:
        p = Path(ref)
        return [p] if p.is_absolute() else [self.source.parent / p, PROJECT_ROOT / p]

    def _rccl_series(self) -> Series | None:
        """The RCCL series, read by the same strict parser as `toolbox patches verify`."""
        rccl = self.model.rccl
        if rccl is None or rccl.patches is None:
            return None
        where = self.origin.where(("rccl", "patches"))
        found = next((c for c in self._local(rccl.patches) if c.is_dir()), None)
        if found is None:
            raise UserError(f"{where}: rccl.patches: no patch series directory {rccl.patches!r}")
        try:
            return parse_series(found.resolve() / "series")
        except MissingPatch as exc:
            raise UserError(f"{where}: rccl.patches: missing patch file {exc.name!r} "
                            f"named in {exc.series}:{exc.line}") from None
        except UserError as exc:
            raise UserError(f"{where}: rccl.patches: {exc}") from None

    def _unsloth_patch_files(self) -> list[Path]:
        """Local patch files for Unsloth, each checked to exist (URL patches are fetched in the build)."""
        out = []
        for i, p in enumerate(self.model.unsloth.patches if self.model.unsloth else []):
            if p.file is None:
                continue
            hit = next((c for c in self._local(p.file) if c.is_file()), None)
            if hit is None:
                where = self.origin.where(("unsloth", "patches", i, "file"))
                raise UserError(f"{where}: unsloth.patches.{i}.file: missing patch file {p.file!r}")
            out.append(hit.resolve())
        return out

    def lock(self) -> dict[str, str]:
        return dict(self.locked.pins)

    def lock_digest(self) -> str:
        return self.locked.digest

    def unverified_pins(self) -> list[str]:
        return list(self.locked.unverified)


def load_stack(ref: str | None = None, overrides: Sequence[str] = ()) -> Stack:
    path = resolve_ref(ref)
    origin = Origin()
    raw = load_raw(path, origin, lambda parent, folder: resolve_ref(parent, relative_to=folder))
    apply_overrides(raw, overrides, origin)
    try:
        model = StackModel.model_validate(raw)
    except ValidationError as exc:
        raise UserError(format_errors(exc, origin)) from None
    return Stack(model, path.resolve(), origin)
