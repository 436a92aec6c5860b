"""Unsloth and unsloth_zoo: from pinned git commits (+ patches applied in the build) or PyPI."""

from toolbox.components import Component, ContextFile


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


def patches(stack) -> list[dict]:
    """Each patch in order: its name in the context, and its file (checked at load) or URL + sha256."""
    out, files = [], iter(stack.unsloth_patches)
    for i, p in enumerate(stack.unsloth.patches):
        if p.file is not None:
            f = next(files)
            out.append({"name": f"{i:02d}-{f.name}", "url": None, "sha256": None, "src": f})
        else:
            out.append({"name": f"{i:02d}-url.patch", "url": p.url, "sha256": p.sha256, "src": None})
    return out


def _requirements(stack) -> tuple[list[str], list[str]]:
    u = stack.unsloth
    extras = f"[{','.join(sorted(u.extras))}]" if u.extras else ""
    if u.source == "git":
        wheels = [wheel_name("unsloth", u.version), wheel_name("unsloth_zoo", u.zoo_version)]
        reqs = [
            f'"unsloth{extras} @ file:///opt/toolbox/wheels/unsloth/{wheels[0]}"',
            f'"unsloth_zoo @ file:///opt/toolbox/wheels/unsloth/{wheels[1]}"',
        ]
        return reqs, wheels
    return [f'"unsloth{extras}=={u.version}"', f"unsloth_zoo=={u.zoo_version}"], []


def _variables(stack, pin_set):
    reqs, wheels = _requirements(stack)
    return {"unsloth_reqs": reqs, "unsloth_wheels": wheels, "unsloth_patches": patches(stack)}


def _context(stack):
    listed = patches(stack)
    if not listed:
        return []
    # .keep: the folder exists even when every patch comes by URL (fetched in the build).
    return [ContextFile(f"patches/unsloth/{p['name']}", src=p["src"]) for p in listed if p["src"]] + [
        ContextFile("patches/unsloth/.keep", text="")]


def _git(stack) -> bool:
    return stack.unsloth.source == "git"


COMPONENT = Component(
    "unsloth", applies=lambda s: s.unsloth is not None, pins=_pins,
    builder="stages/unsloth.j2", runtime="runtime/unsloth.j2",
    builds=_git, needs_devel=_git, variables=_variables, context=_context,
)
