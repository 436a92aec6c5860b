"""RCCL built from a pinned commit of ROCm/rocm-systems with the series in rccl-patches/."""

from typing import Optional

from pydantic import Field, field_validator, model_validator

from toolbox.components import Component, ContextFile, Model, git_bump
from toolbox.components.values import FieldError, check_commit as _commit, check_targets as _targets, check_url as _url
from toolbox.paths import PROJECT_ROOT

RCCL_PATCHES = PROJECT_ROOT / "rccl-patches"
ABICHECK = PROJECT_ROOT / "toolbox" / "rccl" / "abicheck.py"
HIPCHECK = PROJECT_ROOT / "toolbox" / "rccl" / "hipcheck.py"


def _pins(stack):
    r = stack.model.rccl
    return {
        "rccl.commit": r.commit or "unverified",
        "rccl.repo": r.repo,
        "rccl.gpu_targets": ",".join(stack.rccl_targets),
        "rccl.patches.sha256": stack.rccl_series.digest() if stack.rccl_series else "none",
        # Build switches change the library (SMI linked or not) and the image's tools: part of the tag.
        "rccl.enable_smi": str(r.enable_smi).lower(),
        "rccl.build_rccl_tests": str(r.build_rccl_tests).lower(),
        **({} if r.fault_injection is None else {"rccl.fault_injection": str(r.fault_injection).lower()}),
    }


def _checks(model) -> None:
    if model.platform != "rocm":
        raise FieldError(("rccl",), "`rccl:` only belongs to platform rocm")
    if model.rccl.gpu_targets is not None:
        extra = sorted(set(model.rccl.gpu_targets) - set(model.gpu_targets))
        if extra:
            raise FieldError(("rccl", "gpu_targets"),
                             f"rccl.gpu_targets names {', '.join(extra)}, which gpu_targets does not "
                             "(drop rccl.gpu_targets to follow gpu_targets)")


def _first_use(stack, pin):
    """An unset (unverified) rccl.commit: the rocm-systems commit the ROCm tarball's TheRock
    manifest names, once that tarball is pinned on first use (the rocm component's pin, before this)."""
    rocm, rccl = stack.model.rocm, stack.model.rccl
    if rccl.commit is not None or rocm.source != "tarball" or rocm.tarball.sha256 is not None:
        return []
    commit = pin.recorded(rocm.tarball.url).get("rocm_systems_commit")
    if not commit:
        return []
    # No public record names this release's RCCL commit (ROCm 10.1): its own manifest does.
    pin.loud(f"rccl.commit {commit}: the rocm-systems commit {pin.manifest} of {rocm.tarball.url} names")
    return [(("rccl", "commit"), commit), (("rccl", "unverified"), False)]


def series_in_context(stack) -> str | None:
    """The series folder's path inside the context: under rccl-patches/, or _stack/ for one outside."""
    if stack.rccl_series is None:
        return None
    d = stack.rccl_series.path.parent
    try:
        return "rccl-patches/" + d.relative_to(RCCL_PATCHES.resolve()).as_posix()
    except ValueError:
        return f"rccl-patches/_stack/{d.name}"


def _context(stack):
    # The image runs the ABI check against torch's libtorch_hip.so (runtime/torch.j2).
    # ...and the one-HIP-runtime check against `import torch` plus librccl (runtime/torch.j2).
    out = [ContextFile("scripts/rccl-abi-check.py", src=ABICHECK), ContextFile("scripts/hip-runtime-check.py", src=HIPCHECK)]
    if RCCL_PATCHES.is_dir():
        out.append(ContextFile("rccl-patches", src=RCCL_PATCHES))
    where = series_in_context(stack)
    if where and where.startswith("rccl-patches/_stack/"):
        out.append(ContextFile(where, src=stack.rccl_series.path.parent))
    return out


class Rccl(Model):
    repo: str = Field(description='git URL of the repository holding RCCL (ROCm/rocm-systems)')
    # None only while unverified: the build then cannot fetch RCCL at all.
    commit: Optional[str] = Field(None, description='40-hex commit of that repository; None only while unverified')
    subdir: str = Field("projects/rccl", description="RCCL's folder inside the repository")
    patches: Optional[str] = Field(None, description='a patch series folder (with a quilt-style `series` file), relative to the stack file or the project')
    # None: the stack's gpu_targets, so another target is one field for the whole stack.
    gpu_targets: Optional[list[str]] = Field(None, description="targets RCCL is built for; unset: the stack's gpu_targets")
    enable_smi: bool = Field(False, description='build RCCL with amd-smi support')
    build_rccl_tests: bool = Field(False, description='also build rccl-tests (all_reduce_perf, ...) for `rccl-check`')
    fault_injection: Optional[bool] = Field(None, description="RCCL's FAULT_INJECTION cmake option: false builds with "
                                            "-DFAULT_INJECTION=OFF (TheRock#7903: multi-node collectives of 64-512 MB "
                                            "run far slower with it compiled in); unset: RCCL's own default (ON)")
    unverified: bool = Field(False, description='true while the commit is not verified')
    _u = field_validator("repo")(classmethod(lambda cls, v: _url(v)))
    _c = field_validator("commit")(classmethod(lambda cls, v: None if v is None else _commit(v)))
    _t = field_validator("gpu_targets")(classmethod(lambda cls, v: None if v is None else _targets(v)))

    @field_validator("gpu_targets")
    @classmethod
    def _nonempty(cls, v: list[str] | None) -> list[str] | None:
        if v is not None and not v:
            raise ValueError("must name at least one target (an empty list silently builds gfx906)")
        return v

    @model_validator(mode="after")
    def _commit_or_unverified(self) -> "Rccl":
        if self.commit is None and not self.unverified:
            raise ValueError("commit is required (or mark the block `unverified: true`)")
        return self


COMPONENT = Component(
    "rccl", place=20,
    block=Rccl, field=Field(None, description='RCCL built from source with a patch series (platform rocm only)'),
    applies=lambda s: s.model.rccl is not None, pins=_pins,
    builder="stages/rccl.j2", runtime="runtime/rccl.j2", needs_devel=lambda s: True,
    variables=lambda s, pin_set: {"rccl_series": series_in_context(s)}, context=_context,
    exports=lambda s: {"targets": s.rccl_targets}, first_use_pins=_first_use, bumps={"rccl": git_bump("rccl")},
    checks=_checks,
)
