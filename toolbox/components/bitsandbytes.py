"""bitsandbytes built for the stack's GPU targets from a pinned commit (HIP backend)."""

from toolbox.components import Component


def _pins(stack):
    b = stack.bitsandbytes
    return {"bitsandbytes.commit": b.commit, "bitsandbytes.version": b.version}


COMPONENT = Component(
    "bitsandbytes", applies=lambda s: s.bitsandbytes is not None and s.platform == "rocm",
    pins=_pins, builder="stages/bitsandbytes.j2", runtime="runtime/bitsandbytes.j2",
    needs_devel=lambda s: True,
)
