"""Render a stack into a Dockerfile and a whole build context.

Generic over components (toolbox/components/): each active component contributes its
template partials, variables and context files; nothing here names one. Every template also
sees `exports`: {component: its exported values} of the active components (`exports.rocm.prefix`),
which is how one component's template reads another's: never through its block in `stack`. Output is
deterministic: no timestamps, sorted lists, so the same stack renders byte-identical.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import jinja2

from toolbox import components
from toolbox.components import ContextFile
from toolbox.errors import ToolError, UserError
from toolbox.files import write_error
from toolbox.stack.digest import document as lock_document
from toolbox.paths import PROJECT_ROOT
from toolbox.stack.resolved import Stack

TEMPLATES = PROJECT_ROOT / "dockerfiles"
DEVEL_STAGE = "stages/devel.j2"
RESERVED = frozenset({"stack", "lock_digest", "builders", "runtimes", "exports"})


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


def _context(stack: Stack, parts: list[components.Part]) -> dict:
    builders: list[str] = []
    for part in parts:
        if part.builder is None:
            continue
        # One shared devel stage (compilers), placed before the first builder that needs it.
        if part.needs_devel and DEVEL_STAGE not in builders:
            builders.append(DEVEL_STAGE)
        builders.append(part.builder)
    variables = {
        "stack": stack,
        "lock_digest": stack.digest(),
        "builders": builders,
        "runtimes": [part.component.runtime for part in parts if part.component.runtime],
        "exports": _exports(parts),
    }
    owner: dict[str, str] = {}
    for part in parts:
        name = part.component.name
        for key, value in part.variables.items():
            if key in RESERVED or key in owner:
                raise ToolError(f"component {name}: template variable {key!r} is already "
                                f"{'render' if key in RESERVED else owner[key]}'s")
            owner[key] = name
            variables[key] = value
    return variables


def _exports(parts: list[components.Part]) -> dict[str, dict]:
    """{component name: its exported values} of the active components: what a template sees of another."""
    return {part.component.name: part.exports for part in parts}


def _render(template: str, **variables) -> str:
    try:
        return _env().get_template(template).render(**variables)
    except jinja2.TemplateError as exc:
        raise ToolError(f"template error in dockerfiles/{template}: {exc}") from exc


def render_dockerfile(stack: Stack, parts: list[components.Part] | None = None) -> str:
    return _render("Dockerfile.j2", **_context(stack, components.parts(stack) if parts is None else parts))


class _CopyFailed(Exception):
    """An OSError of one file copied by copytree, which would otherwise collect it as text (its
    errno lost: a full disk would read as bad input)."""


def _copy(src: str, dst: str) -> None:
    try:
        shutil.copy2(src, dst)
    except OSError as exc:
        raise _CopyFailed(exc) from exc


def _copytree(src: Path, dst: Path) -> None:
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info", "build", ".pytest_cache")
    shutil.copytree(src, dst, ignore=ignore, dirs_exist_ok=True, copy_function=_copy)


def _place(entry: ContextFile, root: Path, stack: Stack, owner: str, exports: dict) -> None:
    target = root / entry.dest
    target.parent.mkdir(parents=True, exist_ok=True)
    if entry.template is not None:
        target.write_text(_render(entry.template, stack=stack, exports=exports), encoding="utf-8")
    elif entry.text is not None:
        target.write_text(entry.text, encoding="utf-8")
    elif entry.src is None:
        target.mkdir(exist_ok=True)
    elif entry.src.is_dir():
        _copytree(entry.src, target)
    elif entry.src.is_file():
        shutil.copy2(entry.src, target)
    else:
        raise ToolError(f"{entry.src} is missing; component {owner} puts it in the build context")


def write_context(stack: Stack, dest: Path) -> Path:
    """Write the whole build context into dest (created; must not exist or be empty), atomically."""
    dest = Path(dest)
    if dest.exists() and (not dest.is_dir() or any(dest.iterdir())):
        raise UserError(f"{dest}: exists and is not an empty folder")
    parent = dest.parent
    if not parent.is_dir():
        raise UserError(f"{dest}: folder {parent} does not exist")
    parts = components.parts(stack)  # every component asked once, for the Dockerfile and its files
    dockerfile = render_dockerfile(stack, parts)
    try:
        tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", dir=parent))
    except OSError as exc:
        raise write_error(dest, exc) from None
    try:
        (tmp / "Dockerfile").write_text(dockerfile, encoding="utf-8")
        (tmp / "stack.lock.yaml").write_text(lock_document(stack.model, stack.pin_set), encoding="utf-8")
        exports = _exports(parts)
        for part in parts:
            for entry in part.context:
                _place(entry, tmp, stack, part.component.name, exports)
        if dest.exists():
            dest.rmdir()
        os.replace(tmp, dest)
    except (OSError, _CopyFailed) as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        raise write_error(dest, exc.args[0] if isinstance(exc, _CopyFailed) else exc) from None
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return dest
