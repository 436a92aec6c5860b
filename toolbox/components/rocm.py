"""ROCm: a TheRock release tarball (url + sha256, checked in the build) or TheRock from source."""

import re
from typing import Literal, Optional

from pydantic import Field, field_validator, model_validator

from toolbox.components import Component, Model, NewStack, git_bump
from toolbox.errors import UserError
from toolbox.components.values import (
    FieldError,
    check_commit as _commit, check_sha256 as _sha256, check_url as _url, check_version as _version,
    pinned_is_verified as _pinned_is_verified,
)

# What a TheRock dist tarball must contain for this image to work; checked before extracting.
TARBALL_LAYOUT = ["bin/hipcc", "bin/rocminfo", "lib/libamdhip64.so", "share/therock/therock_manifest.json"]


def _pins(stack):
    r = stack.model.rocm
    pins = {"rocm.version": r.version, "rocm.source": r.source, "gpu_targets": ",".join(stack.model.gpu_targets)}
    if r.hip_version:
        pins["rocm.hip_version"] = r.hip_version
    if r.source == "tarball":
        pins["rocm.tarball.url"] = r.tarball.url
        pins["rocm.tarball.sha256"] = r.tarball.sha256 or "unverified"
    else:
        pins["rocm.therock.commit"] = r.therock.commit
        pins["rocm.therock.components"] = ",".join(r.therock.components)
    return pins


def _variables(stack, pin_set):
    stage = "rocm-fetch" if stack.model.rocm.source == "tarball" else "rocm-build"
    return {"rocm_stage": stage, "rocm_layout": TARBALL_LAYOUT}


def _checks(model) -> None:
    if model.platform != "rocm":
        raise FieldError(("rocm",), "`rocm:` only belongs to platform rocm")


def _first_use(stack, pin):
    """A tarball without its sha256 (AMD publishes none): downloaded once, hashed and recorded; its
    TheRock manifest must name the rocm-systems commit of the stack's rccl.commit."""
    rocm = stack.model.rocm
    if rocm.source != "tarball" or rocm.tarball.sha256 is not None:
        return []
    sha = pin.tarball(rocm.tarball.url, rccl_commit=getattr(stack.model.rccl, "commit", None))
    return [(("rocm", "tarball", "sha256"), sha), (("rocm", "tarball", "unverified"), False)]


def _bump(stack, to, tools):
    """`toolbox bump rocm`: the newest stable (or --to) TheRock tarball for the first GPU target
    (toolbox.stack.releases.resolve_tarball), downloaded and hashed; a new ROCm 10 minor: a new stack."""
    path, rocm = tools.path, stack.model.rocm
    if rocm is None or rocm.source != "tarball":
        raise UserError(f"{path}: rocm: bump rocm needs a tarball ROCm (use `bump therock` for source)")
    index = tools.index_url or rocm.tarball.url.rsplit("/", 1)[0] + "/"
    version, url = tools.tarball(index, stack.model.gpu_targets[0], to)
    # Within ROCm 10 each minor is a line of its own (torch +rocm10.0.0 vs +rocm10.1.0): its own stack.
    if version.split(".")[0] == rocm.version.split(".")[0] and version.split(".")[:2] != \
            rocm.version.split(".")[:2] and int(version.split(".")[0]) >= 10 and stack.model.torch.index_url:
        return NewStack(tools.new_line(stack, version, url))
    if version.split(".")[0] != rocm.version.split(".")[0] and stack.model.torch.index_url:
        # The torch pins name their ROCm (+rocm<version>): a new line needs its own torch
        # build, and often another index (whl-next/ from 10.0): not something to guess.
        raise UserError(f"{path}: rocm: {rocm.version} -> {version} changes the ROCm line; torch "
                        f"{stack.model.torch.torch} is built for the old one: start from a stack of that line "
                        "(e.g. gfx1151-rocm10.0, `toolbox stacks`) or set rocm and torch together")
    return {"rocm.version": version, "rocm.tarball.url": url, "rocm.tarball.sha256": tools.sha256_url(url),
            "rocm.tarball.unverified": False}


class Tarball(Model):
    url: str = Field(description='http(s) URL of a TheRock dist tarball')
    sha256: Optional[str] = Field(None, description="the tarball's sha256, checked in the build before extracting")
    unverified: bool = Field(False, description='true while sha256 is unknown: `toolbox build` then pins it on first use (a set sha256 counts as verified)')
    _verified = _pinned_is_verified("sha256")
    _u = field_validator("url")(classmethod(lambda cls, v: _url(v)))
    _s = field_validator("sha256")(classmethod(lambda cls, v: _sha256(v)))

    @model_validator(mode="after")
    def _hash_or_unverified(self) -> "Tarball":
        if self.sha256 is None and not self.unverified:
            raise ValueError("sha256 is required (or mark the pin `unverified: true`)")
        return self


class TheRockSource(Model):
    repo: str = Field(description="TheRock's git URL")
    commit: str = Field(description='40-hex commit of TheRock to build')
    components: list[str] = Field(description='THEROCK_ENABLE_<X> names to build (upper case)')
    unverified: bool = Field(False, description='true while the commit is not verified')
    _u = field_validator("repo")(classmethod(lambda cls, v: _url(v)))
    _c = field_validator("commit")(classmethod(lambda cls, v: _commit(v)))

    @field_validator("components")
    @classmethod
    def _sorted(cls, v: list[str]) -> list[str]:
        for c in v:
            if not re.match(r"^[A-Z0-9_]+$", c):
                raise ValueError(f"component {c!r} is not a THEROCK_ENABLE_<X> name (upper case)")
        return sorted(set(v))


class Rocm(Model):
    source: Literal["tarball", "source"] = Field(description='tarball: a TheRock release tarball; source: build TheRock from a commit')
    version: str = Field(description='ROCm version, exact (e.g. "7.13.0")')
    prefix: str = Field("/opt/rocm", description='where ROCm is installed in the image')
    tarball: Optional[Tarball] = Field(None, description='the tarball (source: tarball)')
    therock: Optional[TheRockSource] = Field(None, description='TheRock checkout (source: source)')
    hip_version: Optional[str] = Field(None, description="HIP's major.minor inside this ROCm where it differs from "
                                       "the ROCm version (ROCm 10.0.0 ships HIP 7.15): what torch.version.hip "
                                       "reports and bitsandbytes picks its library by; unset: the ROCm version's")
    _v = field_validator("version")(classmethod(lambda cls, v: _version(v)))

    @field_validator("hip_version")
    @classmethod
    def _hip(cls, v: str | None) -> str | None:
        if v is not None and not re.fullmatch(r"\d+\.\d+", str(v)):
            raise ValueError(f"must be HIP's major.minor as a quoted string, like \"7.15\", got {v!r}")
        return v

    @property
    def hip(self) -> str:
        """HIP's major.minor: hip_version, else the ROCm version's (7.x releases carry HIP 7.x)."""
        return self.hip_version or ".".join(self.version.split(".")[:2])

    @model_validator(mode="after")
    def _source_block(self) -> "Rocm":
        if self.source == "tarball" and self.tarball is None:
            raise ValueError("source: tarball needs a `tarball:` block (url, sha256)")
        if self.source == "source" and self.therock is None:
            raise ValueError("source: source needs a `therock:` block (repo, commit, components)")
        return self


COMPONENT = Component(
    "rocm", place=10,
    block=Rocm, field=Field(None, description='ROCm (platform rocm only)'),
    applies=lambda s: s.model.rocm is not None, pins=_pins,
    builder="stages/rocm.j2", runtime="runtime/rocm.j2", variables=_variables,
    exports=lambda s: {"prefix": s.model.rocm.prefix, "version": s.model.rocm.version, "source": s.model.rocm.source,
                       "stage": _variables(s, None)["rocm_stage"]},
    first_use_pins=_first_use, bumps={"rocm": _bump, "therock": git_bump("rocm.therock")}, checks=_checks,
)
