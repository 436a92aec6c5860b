"""RCCL built from a pinned commit of ROCm/rocm-systems with the series in rccl-patches/."""

from toolbox.components import Component, ContextFile
from toolbox.paths import PROJECT_ROOT

RCCL_PATCHES = PROJECT_ROOT / "rccl-patches"
ABICHECK = PROJECT_ROOT / "toolbox" / "rccl" / "abicheck.py"
HIPCHECK = PROJECT_ROOT / "toolbox" / "rccl" / "hipcheck.py"


def _pins(stack):
    r = stack.rccl
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


COMPONENT = Component(
    "rccl", applies=lambda s: s.rccl is not None, pins=_pins,
    builder="stages/rccl.j2", runtime="runtime/rccl.j2", needs_devel=lambda s: True,
    variables=lambda s, pin_set: {"rccl_series": series_in_context(s)}, context=_context,
)
