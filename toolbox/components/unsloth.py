"""Unsloth and unsloth_zoo: from pinned git commits (+ patches applied in the build) or PyPI."""

from toolbox.components import Component


def _pins(stack):
    u = stack.unsloth
    pins = {"unsloth.version": u.version, "unsloth_zoo.version": u.zoo_version}
    if u.source == "git":
        pins["unsloth.commit"] = u.commit
        pins["unsloth_zoo.commit"] = u.zoo_commit
    for i, p in enumerate(u.patches):
        pins[f"unsloth.patches.{i}"] = p.sha256 or p.file
    return pins


def wheel_name(dist: str, version: str) -> str:
    return f"{dist}-{version}-py3-none-any.whl"


COMPONENT = Component(
    "unsloth", applies=lambda s: s.unsloth is not None, pins=_pins,
    builder="stages/unsloth.j2", runtime="runtime/unsloth.j2",
)
