"""The stack schema: pydantic models that forbid unknown keys, one description per field.

Each block (`rocm:`, `torch:`, ...) is its component's own model (toolbox.components.<name>,
`Component.block`); this module composes them with the stack's top fields and the checks across
blocks. Validation only (the checks of single values are toolbox.components.values): reading the
YAML (lines, `extends:`, `--set`) is toolbox.stack.source, and what is derived from a valid stack
(patch files, pins, digest) is toolbox.stack.resolved and toolbox.stack.digest.
`python -c 'import json, toolbox.stack.model as m; print(json.dumps(m.StackModel.model_json_schema()))'`
prints the schema with these descriptions.
"""

from __future__ import annotations

import re
from typing import Literal, Optional

from pydantic import Field, create_model, field_validator, model_validator

from toolbox.components import Model, registry
from toolbox.components.values import GFX_RE, FieldError, check_targets, covers


class StackFields(Model):
    """The stack's own fields and the checks across blocks; StackModel adds the components' blocks."""

    name: str = Field(description="stack name: lower case letters, digits, '.', '_' or '-'; part of the image tag")
    description: str = Field("", description='one line saying what the stack is for')
    platform: Literal["rocm", "cuda", "cpu"] = Field(description='rocm, cuda or cpu: which blocks below apply')
    gpu_targets: list[str] = Field(default_factory=list, description='AMD GPU targets (platform rocm only), e.g. [gfx1151]')
    _t = field_validator("gpu_targets")(classmethod(lambda cls, v: check_targets(v)))

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not re.match(r"^[a-z0-9][a-z0-9._-]*$", v):
            raise ValueError(f"must be lower case letters, digits, '.', '_' or '-', got {v!r}")
        return v

    @model_validator(mode="after")
    def _platform(self) -> "StackFields":
        if self.platform == "rocm":
            if self.rocm is None:
                raise FieldError(("platform",), "platform rocm needs a `rocm:` block")
            if not self.gpu_targets:
                raise FieldError(("platform",), "platform rocm needs gpu_targets (e.g. [gfx1151])")
            if self.rccl is not None and self.rccl.gpu_targets is not None:
                extra = sorted(set(self.rccl.gpu_targets) - set(self.gpu_targets))
                if extra:
                    raise FieldError(("rccl", "gpu_targets"),
                                     f"rccl.gpu_targets names {', '.join(extra)}, which gpu_targets does not "
                                     "(drop rccl.gpu_targets to follow gpu_targets)")
            stale = [(name, url) for name, url in (
                ("rocm.tarball.url", self.rocm.tarball.url if self.rocm.source == "tarball" else None),
                ("torch.index_url", self.torch.index_url)) if url and not covers(url, self.gpu_targets)]
            if stale:
                names = " and ".join(n for n, _ in stale)
                built = ", ".join(sorted({t for _, u in stale for t in GFX_RE.findall(u)}))
                raise FieldError(("gpu_targets",), f"{names} {'are' if len(stale) > 1 else 'is'} for {built}, "
                                 f"not gpu_targets {', '.join(self.gpu_targets)}: set {names} for "
                                 f"{', '.join(self.gpu_targets)} too (a tarball URL without its sha256 is "
                                 "pinned on first use)")
            self._one_rocm_line()
        else:
            for key in ("rocm", "rccl"):
                if getattr(self, key) is not None:
                    raise FieldError((key,), f"`{key}:` only belongs to platform rocm")
            if self.gpu_targets:
                raise FieldError(("gpu_targets",), "gpu_targets only belongs to platform rocm")
        l = self.llama_cpp
        if l is not None and l.backend != "cpu" and l.backend != {"rocm": "hip", "cuda": "cuda"}.get(self.platform):
            raise FieldError(("llama_cpp", "backend"), f"backend {l.backend} does not fit platform {self.platform}")
        return self

    def _one_rocm_line(self) -> None:
        """From ROCm 10 on, AMD's indexes hold 7.x and 10.x builds side by side, and pip/uv compare
        local versions as text: +rocm10.0.0 sorts below +rocm7.15.0a... (TheRock
        docs/packaging/versioning.md, #7183). So a torch pin that is not one exact build of this
        ROCm line (+rocm<major>.<minor>.<patch>) could install a 7.x wheel into a 10.x image: refused."""
        major = re.match(r"(\d+)\.(\d+)", self.rocm.version)
        if not self.torch.index_url or major is None or int(major[1]) < 10:
            return
        line = f"{major[1]}.{major[2]}"
        for key in ("torch", "torchvision", "torchaudio"):
            v = getattr(self.torch, key)
            if v is None:
                continue
            local = v.partition("+")[2]
            m = re.fullmatch(r"rocm(\d+)\.(\d+)\.\d+", local)
            if m and f"{m[1]}.{m[2]}" == line:
                continue
            why = "has no local version" if not local else f"names +{local}"
            raise FieldError(("torch", key), f"{v} {why}: on ROCm {self.rocm.version} pin one exact build of "
                             f"its line, +rocm{line}.<patch> (a 7.x wheel sorts above a 10.x one as text, so "
                             "anything looser can install the wrong ROCm line)")


def _block(component):
    """A block's annotation: optional where its Field's default is None (the block may be left out)."""
    return Optional[component.block] if component.field.default is None else component.block


StackModel = create_model("StackModel", __base__=StackFields, __module__=__name__,
                          **{c.block_key: (_block(c), c.field) for c in registry() if c.block is not None})
