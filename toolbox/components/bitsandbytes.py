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


def rocm_library(stack) -> str:
    """The library bitsandbytes loads for the stack's ROCm: libbitsandbytes_rocm<major><minor>.so of
    HIP's version (torch.version.hip: 7.14 on ROCm 7.14, 7.15 on ROCm 10.0), not of the ROCm release."""
    return f"libbitsandbytes_rocm{''.join(stack.rocm.hip.split('.')[:2])}.so"


def _built(stack) -> bool:
    return stack.bitsandbytes.source == "git"


COMPONENT = Component(
    "bitsandbytes", applies=lambda s: s.bitsandbytes is not None and s.platform == "rocm",
    pins=_pins, builder="stages/bitsandbytes.j2", runtime="runtime/bitsandbytes.j2",
    builds=_built, needs_devel=_built,
    variables=lambda s, pin_set: {"bnb_rocm_lib": rocm_library(s), "bnb_hip": s.rocm.hip},
)
