"""bitsandbytes: built for the stack's GPU targets from a pinned commit (HIP backend), or the
released PyPI wheel (hash-checked) where its ROCm builds cover the stack's ROCm (0.50.1 ships
libbitsandbytes_rocm714.so with gfx1151 code; none for 7.13)."""

from toolbox.components import Component


def _pins(stack):
    b = stack.bitsandbytes
    if b.source == "git":
        return {"bitsandbytes.commit": b.commit, "bitsandbytes.version": b.version}
    return {"bitsandbytes.version": b.version, "bitsandbytes.source": "pypi",
            "bitsandbytes.wheel_sha256": b.wheel_sha256 or "unverified"}


def hip(stack) -> str | None:
    """HIP's major.minor as the stack knows it: rocm.hip_version, else a 7.x release's own; None for
    a ROCm 10+ release whose HIP no record gives (10.1): the image build reads torch.version.hip."""
    r = stack.rocm
    return r.hip_version or (r.hip if int(r.version.split(".")[0]) < 10 else None)


def rocm_library(stack) -> str | None:
    """The library bitsandbytes loads for the stack's ROCm: libbitsandbytes_rocm<major><minor>.so of
    HIP's version (torch.version.hip: 7.14 on ROCm 7.14, 7.15 on ROCm 10.0), not of the ROCm release;
    None where HIP's version is read in the image build."""
    h = hip(stack)
    return None if h is None else f"libbitsandbytes_rocm{''.join(h.split('.')[:2])}.so"


def _built(stack) -> bool:
    return stack.bitsandbytes.source == "git"


COMPONENT = Component(
    "bitsandbytes", applies=lambda s: s.bitsandbytes is not None and s.platform == "rocm",
    pins=_pins, builder="stages/bitsandbytes.j2", runtime="runtime/bitsandbytes.j2",
    builds=_built, needs_devel=_built,
    variables=lambda s, pin_set: {"bnb_rocm_lib": rocm_library(s), "bnb_hip": hip(s)},
)
