"""bitsandbytes: built from a pinned commit (a release tag's) with the HIP backend for the stack's
GPU targets against the image's own ROCm, so the library is for exactly the image's HIP
(dockerfiles/scripts/build-bitsandbytes.sh); or the released PyPI wheel (hash-checked) where its
ROCm builds cover the stack's HIP (0.50.2 ships rocm64/70/71/72/714/715, not 7.13's or 7.16's).
Either way the image build runs scripts/bnb-check.py: the exact library for torch's HIP, loaded,
its 4-bit path called (on a GPU) or looked up (without one)."""

from typing import Literal, Optional

from pydantic import Field, field_validator, model_validator

from toolbox.components import Component, ContextFile, LockPart, Model, git_bump
from toolbox.components.values import (
    check_commit as _commit, check_sha256 as _sha256, check_url as _url, check_version as _version,
)
from toolbox.paths import PROJECT_ROOT


def _pins(stack):
    b = stack.model.bitsandbytes
    if b.source == "git":
        return {"bitsandbytes.commit": b.commit, "bitsandbytes.version": b.version}
    return {"bitsandbytes.version": b.version, "bitsandbytes.source": "pypi",
            "bitsandbytes.wheel_sha256": b.wheel_sha256 or "unverified"}


def hip(stack) -> str | None:
    """HIP's major.minor as the stack knows it: rocm.hip_version, else a 7.x release's own; None for
    a ROCm 10+ release whose HIP no record gives (10.1): the image build reads torch.version.hip."""
    r = stack.model.rocm
    return r.hip_version or (r.hip if int(r.version.split(".")[0]) < 10 else None)


def rocm_library(stack) -> str | None:
    """The library bitsandbytes loads for the stack's ROCm: libbitsandbytes_rocm<major><minor>.so of
    HIP's version (torch.version.hip: 7.14 on ROCm 7.14, 7.15 on ROCm 10.0), not of the ROCm release;
    None where HIP's version is read in the image build."""
    h = hip(stack)
    return None if h is None else f"libbitsandbytes_rocm{''.join(h.split('.')[:2])}.so"


CHECK = PROJECT_ROOT / "dockerfiles" / "scripts" / "bnb-check.py"


def _context(stack):
    return [ContextFile("scripts/bnb-check.py", src=CHECK)]


def _built(stack) -> bool:
    return stack.model.bitsandbytes.source == "git"


class Bitsandbytes(Model):
    source: Literal["git", "pypi"] = Field("git", description='git: built from `commit` for the stack\'s targets (HIP backend); '
                                           "pypi: the released manylinux wheel, whose ROCm builds cover the stack's ROCm")
    repo: str = Field("https://github.com/bitsandbytes-foundation/bitsandbytes", description='bitsandbytes git URL')
    commit: Optional[str] = Field(None, description='40-hex commit to build (source: git)')
    version: str = Field(description='the version: the wheel built (source: git) or installed (source: pypi)')
    wheel_sha256: Optional[str] = Field(None, description="sha256 of the manylinux x86_64 wheel (source: pypi), checked in the build")
    unverified: bool = Field(False, description='true while the commit (git) or the wheel sha256 (pypi) is not verified')
    _u = field_validator("repo")(classmethod(lambda cls, v: _url(v)))
    _c = field_validator("commit")(classmethod(lambda cls, v: None if v is None else _commit(v)))
    _v = field_validator("version")(classmethod(lambda cls, v: _version(v)))
    _s = field_validator("wheel_sha256")(classmethod(lambda cls, v: _sha256(v)))

    @model_validator(mode="after")
    def _source_fields(self) -> "Bitsandbytes":
        if self.source == "git":
            if self.commit is None:
                raise ValueError("source: git needs `commit` (40-hex)")
            if self.wheel_sha256 is not None:
                raise ValueError("wheel_sha256 belongs to source: pypi")
        else:
            if self.commit is not None:
                raise ValueError("source: pypi installs the released wheel: set `commit: null`")
            if self.wheel_sha256 is None and not self.unverified:
                raise ValueError("source: pypi needs `wheel_sha256` (or mark the block `unverified: true`)")
        return self


COMPONENT = Component(
    "bitsandbytes", place=40,
    block=Bitsandbytes, field=Field(None, description='bitsandbytes built from source (platform rocm only)'),
    applies=lambda s: s.model.bitsandbytes is not None and s.model.platform == "rocm",
    pins=_pins, builder="stages/bitsandbytes.j2", runtime="runtime/bitsandbytes.j2",
    builds=_built, needs_devel=_built, context=_context,
    variables=lambda s, pin_set: {"bnb_rocm_lib": rocm_library(s), "bnb_hip": hip(s)},
    lock=lambda s: LockPart(requirements=(f"bitsandbytes=={s.model.bitsandbytes.version}",)
                            if s.model.bitsandbytes.source == "pypi" else ()),
    # --to X.Y.Z (a release tag) writes that version too, which the wheel built from the tag carries
    bumps={"bitsandbytes": git_bump("bitsandbytes", tag_version="bitsandbytes.version")},
)
