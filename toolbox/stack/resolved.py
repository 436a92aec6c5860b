"""The resolved stack: a validated stack model and what is derived from it (patch files, the digest).

`toolbox.stack.load.load_stack` builds it; components and render receive it. This module
imports neither the components nor the loading code, so both can name `Stack` without a circle.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from toolbox.errors import UserError
from toolbox.paths import PROJECT_ROOT
from toolbox.rccl.patches import MissingPatch, Series, parse_series
from toolbox.stack.source import Origin
from toolbox.stack.model import StackModel

if TYPE_CHECKING:
    from toolbox.stack.digest import PinSet


class Stack:
    """A validated stack and what is derived from it: patch files (checked), the digest
    (`pin_set`: the pins and their digest, set by load_stack once the components' pins are known)."""

    pin_set: "PinSet | None"  # None until toolbox.stack.load.resolve collects the pins
    python_lock: Any  # toolbox.stack.python_lock.LockState, set by load_stack (not imported: python_lock names components)

    def __init__(self, model: StackModel, source: Path, origin: Origin, raw: dict,
                 derived_from: "Stack | None" = None):
        self.model = model
        self.source = source
        self.origin = origin
        self.raw = raw  # the merged YAML before validation: pin updates apply to it, not to the files
        self.pin_set = None
        if derived_from is None:
            self.rccl_series: Series | None = self._rccl_series()
            self.unsloth_patches = self._unsloth_patch_files()
        else:  # pin updates touch no patch field: what the first load read and checked stays
            self.rccl_series = derived_from.rccl_series
            self.unsloth_patches = derived_from.unsloth_patches

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

    def pins(self) -> dict[str, str]:
        return dict(self.pin_set.pins)

    def digest(self) -> str:
        """The stack's digest: 12 hex of its pins, the image's tag."""
        return self.pin_set.digest

    def unverified_pins(self) -> list[str]:
        return list(self.pin_set.unverified)
