"""RCCL built from a pinned commit of ROCm/rocm-systems with the series in rccl-patches/."""

from toolbox.components import Component


def _pins(stack):
    r = stack.rccl
    pins = {
        "rccl.commit": r.commit or "unverified",
        "rccl.repo": r.repo,
        "rccl.gpu_targets": ",".join(stack.rccl_targets),
    }
    digest = stack.patch_series_digest()
    pins["rccl.patches.sha256"] = digest or "none"
    return pins


COMPONENT = Component(
    "rccl", applies=lambda s: s.rccl is not None, pins=_pins,
    builder="stages/rccl.j2", runtime="runtime/rccl.j2",
)
