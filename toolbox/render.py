"""Render a stack into a Dockerfile and a whole build context.

Output is deterministic: no timestamps, sorted lists, so the same stack renders byte-identical.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import jinja2
import yaml

from toolbox import components
from toolbox.components import base as base_c
from toolbox.components import hf as hf_c
from toolbox.components import rocm as rocm_c
from toolbox.components import torch as torch_c
from toolbox.components import unsloth as unsloth_c
from toolbox.components.labels import labels as stack_labels
from toolbox.errors import ToolError, UserError
from toolbox.stack import PROJECT_ROOT, Stack

TEMPLATES = PROJECT_ROOT / "dockerfiles"
SCRIPTS = TEMPLATES / "scripts"
ENTRYPOINTS = PROJECT_ROOT / "entrypoints"
RCCL_PATCHES = PROJECT_ROOT / "rccl-patches"
ABICHECK = PROJECT_ROOT / "toolbox" / "rccl" / "abicheck.py"


def _env() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(TEMPLATES)),
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
        autoescape=False,
    )
    # Dockerfile label values: JSON strings are valid double-quoted Dockerfile words.
    env.filters["tojson"] = lambda v: json.dumps(str(v), ensure_ascii=False)
    return env


def rccl_series_in_context(stack: Stack) -> str | None:
    """The series dir's path inside the context (under rccl-patches/)."""
    d = stack.rccl_patch_dir
    if d is None:
        return None
    try:
        return "rccl-patches/" + d.relative_to(RCCL_PATCHES.resolve()).as_posix()
    except ValueError:
        return f"rccl-patches/_stack/{d.name}"


def _unsloth_patches(stack: Stack) -> list[dict]:
    u = stack.unsloth
    if u is None:
        return []
    out, files = [], iter(stack.unsloth_patches)
    for i, p in enumerate(u.patches):
        if p.file is not None:
            f = next(files)
            out.append({"name": f"{i:02d}-{f.name}", "url": None, "sha256": None, "src": f})
        else:
            out.append({"name": f"{i:02d}-url.patch", "url": p.url, "sha256": p.sha256, "src": None})
    return out


def _unsloth_reqs(stack: Stack) -> tuple[list[str], list[str]]:
    u = stack.unsloth
    if u is None:
        return [], []
    extras = f"[{','.join(sorted(u.extras))}]" if u.extras else ""
    if u.source == "git":
        wheels = [unsloth_c.wheel_name("unsloth", u.version), unsloth_c.wheel_name("unsloth_zoo", u.zoo_version)]
        reqs = [
            f'"unsloth{extras} @ file:///opt/toolbox/wheels/unsloth/{wheels[0]}"',
            f'"unsloth_zoo @ file:///opt/toolbox/wheels/unsloth/{wheels[1]}"',
        ]
        return reqs, wheels
    return [f'"unsloth{extras}=={u.version}"', f"unsloth_zoo=={u.zoo_version}"], []


def _context(stack: Stack) -> dict:
    active = components.active(stack)
    names = {c.name for c in active}
    builders = []
    for c in active:
        if c.builder is None:
            continue
        if c.name == "unsloth" and stack.unsloth.source != "git":
            continue
        builders.append(c.builder)
        if c.name == "rocm" or (c.name == "base" and "rocm" not in names):
            if names & {"rccl", "bitsandbytes"} or (stack.unsloth is not None and stack.unsloth.source == "git"):
                builders.append("stages/devel.j2")
    rocm_stage = None
    if stack.rocm is not None:
        rocm_stage = "rocm-fetch" if stack.rocm.source == "tarball" else "rocm-build"
    unsloth_reqs, unsloth_wheels = _unsloth_reqs(stack)
    return {
        "stack": stack,
        "lock_digest": stack.lock_digest(),
        "builders": builders,
        "runtimes": [c.runtime for c in active if c.runtime],
        "packages": {k: base_c.os_packages(stack, k) for k in ("runtime", "toolbx", "devel")},
        "python": "python3" if stack.base.family == "debian" else stack.base.python,
        "rocm_stage": rocm_stage,
        "rocm_layout": rocm_c.TARBALL_LAYOUT,
        "rccl_series": rccl_series_in_context(stack),
        "torch_reqs": torch_c.requirements(stack),
        "hf_reqs": hf_c.requirements(stack),
        "unsloth_reqs": unsloth_reqs,
        "unsloth_wheels": unsloth_wheels,
        "unsloth_patches": _unsloth_patches(stack),
        "labels": stack_labels(stack),
    }


def render_dockerfile(stack: Stack) -> str:
    try:
        return _env().get_template("Dockerfile.j2").render(**_context(stack))
    except jinja2.TemplateError as exc:
        raise ToolError(f"template error in dockerfiles/: {exc}") from exc


def render_profile(stack: Stack) -> str:
    return _env().get_template("scripts/profile.sh.j2").render(stack=stack)


def lock_document(stack: Stack) -> str:
    doc = {
        "stack": stack.name,
        "platform": stack.platform,
        "base_image": stack.base_image,
        "lock_digest": stack.lock_digest(),
        "pins": stack.lock(),
        "unverified": stack.unverified_pins(),
    }
    return yaml.safe_dump(doc, sort_keys=True, default_flow_style=False)


def atomic_write(path: Path, text: str) -> Path:
    """Write beside the target, then rename: a reader never sees half a file."""
    path = Path(path)
    if path.is_dir():
        raise UserError(f"{path}: is a directory; --output names a file")
    parent = path.parent if str(path.parent) else Path(".")
    if not parent.is_dir():
        raise UserError(f"{path}: folder {parent} does not exist")
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def _copytree(src: Path, dst: Path) -> None:
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info", "build", ".pytest_cache")
    shutil.copytree(src, dst, ignore=ignore)


def write_context(stack: Stack, dest: Path) -> Path:
    """Write the whole build context into dest (created; must not exist or be empty), atomically."""
    dest = Path(dest)
    if dest.exists() and (not dest.is_dir() or any(dest.iterdir())):
        raise UserError(f"{dest}: exists and is not an empty folder")
    parent = dest.parent
    if not parent.is_dir():
        raise UserError(f"{dest}: folder {parent} does not exist")
    dockerfile = render_dockerfile(stack)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", dir=parent))
    try:
        (tmp / "Dockerfile").write_text(dockerfile, encoding="utf-8")
        (tmp / "stack.lock.yaml").write_text(lock_document(stack), encoding="utf-8")
        scripts = tmp / "scripts"
        scripts.mkdir()
        for f in sorted(SCRIPTS.iterdir()):
            if f.suffix == ".sh":
                shutil.copy2(f, scripts / f.name)
        (scripts / "profile.sh").write_text(render_profile(stack), encoding="utf-8")
        if stack.rccl is not None:
            if not ABICHECK.is_file():
                raise ToolError(f"{ABICHECK} is missing; the rocm image runs it against torch")
            shutil.copy2(ABICHECK, scripts / "rccl-abi-check.py")
        _copytree(ENTRYPOINTS, tmp / "entrypoints")
        if RCCL_PATCHES.is_dir():
            _copytree(RCCL_PATCHES, tmp / "rccl-patches")
        else:
            (tmp / "rccl-patches").mkdir()
        series = rccl_series_in_context(stack)
        if series and series.startswith("rccl-patches/_stack/"):
            _copytree(stack.rccl_patch_dir, tmp / series)
        patches = _unsloth_patches(stack)
        if patches:
            pdir = tmp / "patches" / "unsloth"
            pdir.mkdir(parents=True)
            for p in patches:
                if p["src"] is not None:
                    shutil.copy2(p["src"], pdir / p["name"])
            (pdir / ".keep").write_text("", encoding="utf-8")
        (tmp / "wheelhouse").mkdir()
        if dest.exists():
            dest.rmdir()
        os.replace(tmp, dest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return dest
