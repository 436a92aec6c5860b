"""`toolbox bump TARGET`: resolve a new release and rewrite the stack's pins, so every build stays pinned.

Each target is a component's `bumps` hook (toolbox.components): rocm (a TheRock tarball, or a new
stack for a new ROCm 10 line) and therock, torch, base, and the blocks pinned by a git commit
(rccl, bitsandbytes, unsloth, unsloth_zoo: `git_bump`). A hook gets `Tools`: the remote lookups
(`git ls-remote`, a registry's v2 API, a download's sha256, AMD's indexes in
toolbox.stack.releases) and returns the changes; nothing here names a component.

The file is edited line by line (comments stay), re-validated, then written atomically.
"""

from __future__ import annotations

import re
from pathlib import Path

from toolbox import components
from toolbox.errors import ToolError, UserError
from toolbox.files import atomic_write
from toolbox.stack import releases
from toolbox.stack.load import load_stack, resolve_ref
from toolbox.stack.remote import resolve_digest, resolve_git, sha256_url
from toolbox.stack.source import field_lines, writes

COMPONENTS = list(components.bump_targets())  # the targets `toolbox bump` takes


class Tools:
    """What a component's bump hook resolves with: the stack file's path (messages name it), the
    --index-url and --registry-url given, and the remote lookups."""

    def __init__(self, path: Path, index_url: str | None, registry_url: str | None):
        self.path, self.index_url, self.registry_url = path, index_url, registry_url

    git = staticmethod(resolve_git)  # (repo, to) -> the 40-hex commit of --to (default HEAD)
    sha256_url = staticmethod(sha256_url)  # a file downloaded and hashed
    tarball = staticmethod(releases.resolve_tarball)  # (index, target, to) -> (version, url)
    wheels = staticmethod(releases.resolve_torch)  # (stack, index, to) -> the torch wheel set's changes

    def digest(self, image: str) -> str:
        return resolve_digest(image, self.registry_url)

    def new_line(self, stack, version: str, url: str) -> dict[str, object]:
        """The new stack of another ROCm line beside this one, written (releases.new_line)."""
        return releases.new_line(self.path, stack, version, url, _write_checked)


def _yaml_scalar(value) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    return f'"{value}"' if re.match(r"^[0-9]", str(value)) else str(value)


def edit_fields(path: Path, changes: dict[str, object]) -> str:
    """Rewrite `key: value` lines for dotted field paths in the file; each must be written there."""
    written = field_lines(path)
    lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
    for dotted, value in changes.items():
        key = tuple(dotted.split("."))
        if key not in written:
            raise UserError(f"{path}: {dotted}: not written in this file (add it, then bump)")
        n = written[key] - 1
        m = re.match(r"^(\s*(?:-\s+)?" + re.escape(key[-1]) + r":)(\s*)([^\n]*?)(\s+#[^\n]*)?(\n?)$", lines[n])
        if not m:
            raise ToolError(f"{path}:{n + 1}: {dotted}: cannot edit this line in place")
        lines[n] = f"{m.group(1)} {_yaml_scalar(value)}{m.group(4) or ''}{m.group(5)}"
    return "".join(lines)


def bump(component: str, stack_ref: str | None, to: str | None, *, index_url: str | None = None,
         registry_url: str | None = None) -> dict[str, object]:
    targets = components.bump_targets()
    if component not in targets:
        raise UserError(f"bump: unknown component {component!r}; one of {', '.join(targets)}")
    path = resolve_ref(stack_ref)
    stack = load_stack(str(path))
    changes = targets[component](stack, to, Tools(path, index_url, registry_url))
    if isinstance(changes, components.NewStack):
        return changes.result
    changes = {k: v for k, v in changes.items() if k.endswith("unverified") is False or writes(path, k)}
    text = edit_fields(path, changes)
    _write_checked(path, text)
    return changes


def _write_checked(path: Path, text: str) -> None:
    """Write a stack file only once its new text loads as a stack (checked from a temporary file
    beside it, where its `extends:` resolves as it will), then atomically."""
    tmp = path.with_name(f".{path.name}.bump")
    tmp.write_text(text, encoding="utf-8")
    try:
        load_stack(str(tmp))
    finally:
        tmp.unlink(missing_ok=True)
    atomic_write(path, text)
