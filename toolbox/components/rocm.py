"""ROCm: a TheRock release tarball (url + sha256, checked in the build) or TheRock from source."""

from toolbox.components import Component

# What a TheRock dist tarball must contain for this image to work; checked before extracting.
TARBALL_LAYOUT = ["bin/hipcc", "bin/rocminfo", "lib/libamdhip64.so", "share/therock/therock_manifest.json"]


def _pins(stack):
    r = stack.rocm
    pins = {"rocm.version": r.version, "rocm.source": r.source, "gpu_targets": ",".join(stack.gpu_targets)}
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
    stage = "rocm-fetch" if stack.rocm.source == "tarball" else "rocm-build"
    return {"rocm_stage": stage, "rocm_layout": TARBALL_LAYOUT}


COMPONENT = Component(
    "rocm", applies=lambda s: s.rocm is not None, pins=_pins,
    builder="stages/rocm.j2", runtime="runtime/rocm.j2", variables=_variables,
)
