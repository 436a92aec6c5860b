"""Reading stack files: YAML with the line of every field, `extends:` and `--set` overrides.

The result is a plain dict plus an `Origin` (where each field path was written), so that a
validation error of toolbox.stack.model names the file and line the user must edit. Public
API (toolbox.stack.bumping uses it too): `Origin`, `read_yaml`, `load_raw`, `apply_overrides`,
`apply_values`, `format_errors`, `field_lines`.
"""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from pydantic import ValidationError
from toolbox_train import safe_yaml

from toolbox.errors import UserError
from toolbox.components.values import coupled_names


@dataclass
class Origin:
    """Where each field path of the merged raw stack came from: (file or `--set ...`, line)."""

    lines: dict[tuple, tuple[str, int | None]] = field(default_factory=dict)

    def find(self, path: tuple) -> tuple[str, int | None]:
        """The nearest recorded place of path or of its closest parent."""
        for n in range(len(path), -1, -1):
            if path[:n] in self.lines:
                return self.lines[path[:n]]
        return ("<stack>", None)

    def where(self, path: tuple) -> str:
        src, line = self.find(path)
        return f"{src}:{line}" if line else src


def read_yaml(path: Path, origin: Origin) -> dict:
    """One YAML file (no `extends:` handling) as a dict; records each field's line in origin.

    Read by the hardened reader the training configs use too (toolbox_train.safe_yaml): sizes,
    depth, aliases, tags, keys and bytes are bounded or refused with file:line:column.
    """
    src = str(path)
    try:
        doc = safe_yaml.load_file(path, what="stack file")
    except safe_yaml.SafeYamlError as exc:
        raise UserError(str(exc)) from None
    if not isinstance(doc.data, dict):
        raise UserError(f"{src}:1: a stack file must be a YAML mapping")
    origin.lines[()] = (src, 1)
    origin.lines.update({p: (src, line) for p, (line, _col) in doc.marks.items()})
    return doc.data


def field_lines(path: Path) -> dict[tuple, int]:
    """The line each field path is written on in this one file (for in-place edits)."""
    origin = Origin()
    read_yaml(path, origin)
    return {k: line for k, (_, line) in origin.lines.items() if line is not None}


def writes(path: Path, dotted: str) -> bool:
    """Whether this one file writes the field `a.b.c` (not only inherits it)."""
    return tuple(dotted.split(".")) in field_lines(path)


def _merge(base: dict, over: dict) -> dict:
    out = copy.deepcopy(base)
    for k, v in over.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = _merge(out[k], v)
        else:
            out[k] = copy.deepcopy(v)
    return out


# Fields derived from another. When a layer (a file over the stack it extends, or the --set
# options over the file) changes the first and does not set the second, the inherited second is
# stale: it is dropped, and the third item's fields set. rccl.gpu_targets then follows
# gpu_targets; a new tarball URL's old sha256 is unknown again (pinned on first use).
FOLLOWS: list[tuple[tuple, tuple, dict[tuple, Any]]] = [
    (("gpu_targets",), ("rccl", "gpu_targets"), {}),
    (("rocm", "tarball", "url"), ("rocm", "tarball", "sha256"), {("rocm", "tarball", "unverified"): True}),
    # a first-use wheel pin is of one version from one index
    (("torch", "index_url"), ("torch", "wheels"), {}),
    *((("torch", n), ("torch", "wheels", n), {}) for n in ("torch", "torchvision", "torchaudio")),
    # ...and so is a wheel coupled to torch (its device wheels, triton, rocm-sdk-*): another torch
    # (torchvision, for its device wheel) has other ones; left to the index's exact pins then.
    *((("torch", "torchvision" if n.startswith("amd-torchvision-") else "torch"), ("torch", "wheels", n), {})
      for n in coupled_names()),
]
_ABSENT = object()


def key_paths(value: Any, prefix: tuple = ()) -> set[tuple]:
    """Every field path a (nested) mapping sets, prefix included."""
    out = {prefix} if prefix else set()
    if isinstance(value, dict):
        for k, v in value.items():
            out |= key_paths(v, prefix + (k,))
    return out


def _get(d: Any, path: tuple) -> Any:
    for part in path:
        if not isinstance(d, dict) or part not in d:
            return _ABSENT
        d = d[part]
    return d


def follow(before: dict, after: dict, layer: set[tuple], origin: Origin) -> None:
    """Reset the FOLLOWS fields that `layer` (the paths one layer set) made stale in `after`."""
    for trigger, dependent, also in FOLLOWS:
        if trigger not in layer or dependent in layer or _get(before, trigger) == _get(after, trigger):
            continue
        block = _get(after, dependent[:-1])
        if not isinstance(block, dict) or dependent[-1] not in block:
            continue
        del block[dependent[-1]]
        origin.lines.pop(dependent, None)
        for path, value in also.items():
            target = _get(after, path[:-1])
            if path not in layer and isinstance(target, dict):
                target[path[-1]] = value
                origin.lines[path] = origin.find(trigger)


def load_raw(path: Path, origin: Origin, resolve: Callable[[str, Path], Path],
             seen: tuple[Path, ...] = ()) -> dict:
    """The file merged over what it `extends:` (resolve(ref, folder) finds the parent file)."""
    path = Path(path).absolute()  # named as given (not through symlinks) in messages
    real = path.resolve()
    if real in seen:
        raise UserError(f"{path}: extends: cycle ({' -> '.join(str(s) for s in seen + (real,))})")
    raw = read_yaml(path, origin)
    parent = raw.pop("extends", None)
    if parent is None:
        return raw
    if not isinstance(parent, str):
        raise UserError(f"{origin.where(('extends',))}: extends: must be a stack name or a path")
    try:
        parent_path = resolve(parent, path.parent)
    except UserError as exc:
        raise UserError(f"{origin.where(('extends',))}: extends: {exc}") from None
    base_origin = Origin()
    base = load_raw(parent_path, base_origin, resolve, seen + (real,))
    # The child's lines win where it sets a field; the rest point into the parent.
    merged_lines = dict(base_origin.lines)
    merged_lines.update({k: v for k, v in origin.lines.items() if k != ("extends",)})
    origin.lines = merged_lines
    merged = _merge(base, raw)
    follow(base, merged, key_paths(raw), origin)
    return merged


def apply_overrides(raw: dict, texts: Sequence[str], origin: Origin) -> None:
    """Apply the --set options, then reset the fields they made stale (FOLLOWS)."""
    before, layer = copy.deepcopy(raw), set()
    for text in texts:
        layer |= apply_override(raw, text, origin)
    follow(before, raw, layer, origin)


def apply_values(raw: dict, values: Sequence[tuple[tuple[str, ...], Any]], origin: Origin, src: str) -> None:
    """Set typed values at field paths (no text to parse: first-use pins), then reset the fields
    they made stale (FOLLOWS); `src` is what error messages name as their origin."""
    before, layer = copy.deepcopy(raw), set()
    for path, value in values:
        layer |= set_field(raw, path, value, origin, src)
    follow(before, raw, layer, origin)


def apply_override(raw: dict, text: str, origin: Origin) -> set[tuple]:
    """Apply one `--set key.path=value` (value read as YAML, numbers kept as written); returns
    the field paths it set."""
    src = f"--set {text}" if text.isprintable() else f"--set {text!r}"  # a line break stays one line
    key, sep, value = text.partition("=")
    if not sep or not re.match(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$", key):
        raise UserError(f"{src}: expected key.path=value")
    try:
        parsed = safe_yaml.load_text(value, src).data if value != "" else ""
    except safe_yaml.SafeYamlError:
        parsed = value  # not YAML: the text itself (validation then says if a string fits)
    # Versions stay strings: `--set hf.trl=1.10` must not become the float 1.1.
    if isinstance(parsed, (int, float)) and not isinstance(parsed, bool):
        parsed = value
    return set_field(raw, tuple(key.split(".")), parsed, origin, src)


def set_field(raw: dict, parts: tuple[str, ...], value: Any, origin: Origin, src: str) -> set[tuple]:
    """Set raw[parts...] = value (creating mappings on the way); returns the field paths it set."""
    node = raw
    for i, part in enumerate(parts[:-1]):
        nxt = node.get(part)
        if nxt is None:
            nxt = node[part] = {}
        if not isinstance(nxt, dict):
            raise UserError(f"{src}: {'.'.join(parts[: i + 1])} is not a mapping")
        node = nxt
    node[parts[-1]] = value
    for n in range(1, len(parts) + 1):
        origin.lines[tuple(parts[:n])] = (src, None)
    return {tuple(parts[:n]) for n in range(1, len(parts))} | key_paths(value, tuple(parts))


def format_errors(exc: ValidationError, origin: Origin) -> str:
    """One `file:line: field.path: message` line per pydantic error."""
    msgs = []
    for err in exc.errors():
        loc = tuple(p for p in err["loc"] if not (isinstance(p, str) and p.startswith("function-")))
        loc += getattr((err.get("ctx") or {}).get("error"), "field", ())  # stack_model.FieldError
        path = ".".join(str(p) for p in loc) or "<top>"
        msg = err["msg"].removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            msg = "unknown key (check the spelling)"
        msgs.append(f"{origin.where(loc)}: {path}: {msg}")
    return "\n".join(msgs)
