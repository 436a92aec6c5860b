"""The one YAML reader for stack files and training configs: bounded, plain data, positions kept.

PyYAML's safe loader still hangs on an alias bomb (it expands every alias), dies with
RecursionError on deep nesting (its composer recurses) and raises several exception types
for bad bytes, tags and keys. This reader builds values from PyYAML's event stream itself,
iteratively, and refuses each of those with one `SafeYamlError` naming file:line:column and
the field path:

- the file: at most `max_bytes`, UTF-8, no control characters (a NUL is reported by line);
- one document; keys are plain text (as written: `on:` is "on", not True), unique, never a
  list or mapping (`? [a, b]`) or an alias;
- values: YAML's plain types only (str, int, float, bool, null, timestamp); a tag such as
  `!foo` or `!!python/object` is refused;
- aliases are allowed, but the values they copy in count against `max_nodes`, so a 1 KB
  alias bomb is refused at once instead of growing for minutes; `<<` merge keys work;
- nesting at most `max_depth` levels.

Torch-free and toolbox-free: the image ships it in toolbox_train, the host imports it too.
`load_file(path)` / `load_text(text, source)` return a `Document`: `.data` and `.marks`, the
(line, column) where each field path is written, so later validation errors can name the line.
"""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from toolbox_train.contract import UserError

MAX_BYTES = 1 << 20
MAX_DEPTH = 64
MAX_NODES = 100_000
_TAG = "tag:yaml.org,2002:"
_PLAIN_TAGS = {_TAG + t for t in ("str", "int", "float", "bool", "null", "timestamp")}
# The characters PyYAML's reader refuses (it reports them by offset, not line).
_NON_PRINTABLE = re.compile("[^\x09\x0A\x0D\x20-\x7E\x85\xA0-\uD7FF\uE000-\uFFFD\U00010000-\U0010FFFF]")


class SafeYamlError(UserError):
    """A refused YAML input; the message is `source:line:column: path: problem`."""

    def __init__(self, source: str, line: int | None, column: int | None, path: tuple, problem: str):
        where = source + (f":{line}" if line else "") + (f":{column}" if line and column else "")
        shown = path if len(path) <= 8 else (*path[:4], f"...({len(path) - 6} more)...", *path[-2:])
        dotted = ".".join(str(p) for p in shown)
        super().__init__(f"{where}: {dotted + ': ' if dotted else ''}{problem}")
        self.source, self.line, self.column, self.path, self.problem = source, line, column, path, problem


@dataclass
class Document:
    data: Any
    marks: dict[tuple, tuple[int, int]] = field(default_factory=dict)


@dataclass
class _Frame:
    value: Any  # the dict or list being filled
    path: tuple
    anchor: str | None
    size: int = 1
    key: Any = None  # a mapping's pending key (None: expecting a key)
    key_mark: Any = None
    merges: list = field(default_factory=list)
    start_mark: Any = None


def _position(text: str, index: int) -> tuple[int, int]:
    line = text.count("\n", 0, index) + 1
    return line, index - (text.rfind("\n", 0, index) + 1) + 1


def decode(data: bytes, source: str, max_bytes: int = MAX_BYTES, what: str = "YAML file") -> str:
    """UTF-8 text of data, or a SafeYamlError naming the first bad byte or character by line."""
    _size(len(data), source, max_bytes, what)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line, col = _position(data[: exc.start].decode("utf-8", "replace"), exc.start)
        raise SafeYamlError(source, line, col, (), f"not UTF-8 text (byte 0x{data[exc.start]:02x}); "
                            f"is this a {what}?") from None
    _printable(text, source, what)
    return text.removeprefix("\ufeff")


def _size(n: int, source: str, max_bytes: int, what: str) -> None:
    if n > max_bytes:
        raise SafeYamlError(source, None, None, (), f"{n / 1e6:.1f} MB is more than a {what} may be "
                            f"({max_bytes / 1e6:.1f} MB)")


def _printable(text: str, source: str, what: str) -> None:
    bad = _NON_PRINTABLE.search(text)
    if bad:
        line, col = _position(text, bad.start())
        ch = bad.group()
        name = "a NUL byte" if ch == "\0" else f"control character U+{ord(ch):04X}"
        raise SafeYamlError(source, line, col, (), f"{name}: not allowed in YAML; is this a {what}?")


def load_file(path: Path | str, max_bytes: int = MAX_BYTES, what: str = "YAML file") -> Document:
    path = Path(path)
    try:
        _size(path.stat().st_size, str(path), max_bytes, what)  # refused before reading 60 MB
        data = path.read_bytes()
    except OSError as exc:
        raise SafeYamlError(str(path), None, None, (), f"cannot read: {exc.strerror or exc}") from None
    return load_text(decode(data, str(path), max_bytes, what), str(path), what=what)


class _Builder:
    def __init__(self, source: str, max_depth: int, max_nodes: int):
        self.source, self.max_depth, self.max_nodes = source, max_depth, max_nodes
        self.frames: list[_Frame] = []
        self.anchors: dict[str, tuple[Any, int]] = {}
        self.open_anchors: set[str] = set()
        self.nodes = 0
        self.doc = Document(None)
        self.documents = 0
        self.resolver = yaml.resolver.Resolver()
        self.constructor = yaml.constructor.SafeConstructor()

    def fail(self, mark, problem: str, path: tuple | None = None):
        problem = problem.replace(_TAG, "!!")
        path = self.path() if path is None else path
        raise SafeYamlError(self.source, mark.line + 1 if mark else None, mark.column + 1 if mark else None,
                            path, problem)

    def path(self) -> tuple:
        if not self.frames:
            return ()
        top = self.frames[-1]
        if isinstance(top.value, list):
            return top.path + (len(top.value),)
        return top.path + ((top.key,) if top.key not in (None, _Merge) else ())

    def count(self, n: int, mark) -> None:
        """Values copied in by aliases (what is written is bounded by the file's size)."""
        self.nodes += n
        if self.nodes > self.max_nodes:
            self.fail(mark, f"aliases expand to more than {self.max_nodes} values (an alias bomb?)")

    def event(self, ev) -> None:
        if isinstance(ev, yaml.DocumentStartEvent):
            self.documents += 1
            if self.documents > 1:
                self.fail(ev.start_mark, "more than one YAML document (---); a file holds one", ())
        elif isinstance(ev, (yaml.MappingStartEvent, yaml.SequenceStartEvent)):
            self.collection_start(ev)
        elif isinstance(ev, (yaml.MappingEndEvent, yaml.SequenceEndEvent)):
            self.collection_end(ev)
        elif isinstance(ev, yaml.ScalarEvent):
            self.scalar(ev)
        elif isinstance(ev, yaml.AliasEvent):
            self.alias(ev)

    def expecting_key(self) -> bool:
        return bool(self.frames) and isinstance(self.frames[-1].value, dict) and self.frames[-1].key is None

    def collection_start(self, ev) -> None:
        is_map = isinstance(ev, yaml.MappingStartEvent)
        if self.expecting_key():
            self.fail(ev.start_mark, "a list or mapping as a key (`? [a, b]`) is not allowed; keys are plain text")
        if ev.tag not in (None, "!", _TAG + ("map" if is_map else "seq")):
            self.fail(ev.start_mark, f"tag {ev.tag} is not allowed (plain YAML values only)")
        if len(self.frames) >= self.max_depth:
            self.fail(ev.start_mark, f"nested deeper than {self.max_depth} levels")
        if ev.anchor:
            self.open_anchors.add(ev.anchor)
        self.frames.append(_Frame({} if is_map else [], self.path(), ev.anchor, start_mark=ev.start_mark))

    def collection_end(self, ev) -> None:
        frame = self.frames.pop()
        if isinstance(frame.value, dict):
            for value, mark in frame.merges:  # explicit keys win over merged ones
                for src in value if isinstance(value, list) else [value]:
                    if not isinstance(src, dict):
                        self.fail(mark, "`<<` merges a mapping or a list of mappings", frame.path)
                    for k, v in src.items():
                        frame.value.setdefault(k, v)
        if frame.anchor:
            self.open_anchors.discard(frame.anchor)
            self.anchors[frame.anchor] = (frame.value, frame.size)
        self.add(frame.value, frame.size, frame.start_mark)

    def scalar(self, ev) -> None:
        if self.expecting_key():
            if ev.tag not in (None, "!", _TAG + "str"):
                self.fail(ev.start_mark, f"tag {ev.tag} is not allowed on a key")
            top = self.frames[-1]
            merge = ev.implicit[0] and ev.value == "<<"
            top.key, top.key_mark = (_Merge if merge else ev.value), ev.start_mark
            if not merge and top.key in top.value:
                self.fail(ev.start_mark, "duplicate key")
            return
        tag = ev.tag
        if tag in (None, "!"):
            tag = self.resolver.resolve(yaml.ScalarNode, ev.value, ev.implicit)
        if tag not in _PLAIN_TAGS:
            self.fail(ev.start_mark, f"tag {ev.tag or tag} is not allowed (plain YAML values only)")
        try:
            value = self.constructor.construct_object(yaml.ScalarNode(tag, ev.value, ev.start_mark, ev.end_mark,
                                                                      ev.style))
        except Exception as exc:  # noqa: BLE001 (a bad timestamp/number: PyYAML raises several types)
            self.fail(ev.start_mark, f"cannot read {ev.value!r} as {tag.rsplit(':', 1)[-1]}: {exc}")
        if ev.anchor:
            self.anchors[ev.anchor] = (value, 1)
        self.add(value, 1, ev.start_mark)

    def alias(self, ev) -> None:
        if self.expecting_key():
            self.fail(ev.start_mark, "an alias as a key is not allowed; keys are plain text")
        if ev.anchor in self.open_anchors:
            self.fail(ev.start_mark, f"alias *{ev.anchor} refers to the collection it is in")
        if ev.anchor not in self.anchors:
            self.fail(ev.start_mark, f"alias *{ev.anchor} has no anchor &{ev.anchor} before it")
        value, size = self.anchors[ev.anchor]
        self.count(size, ev.start_mark)  # before copying: the bound holds for what is built
        self.add(copy.deepcopy(value), size, ev.start_mark)

    def add(self, value: Any, size: int, mark) -> None:
        if not self.frames:
            self.doc.data = value
            return
        top = self.frames[-1]
        top.size += size
        if isinstance(top.value, list):
            self.doc.marks[top.path + (len(top.value),)] = (mark.line + 1, mark.column + 1)
            top.value.append(value)
        elif top.key is _Merge:
            top.merges.append((value, top.key_mark))
            top.key = None
        else:
            self.doc.marks[top.path + (top.key,)] = (top.key_mark.line + 1, top.key_mark.column + 1)
            top.value[top.key] = value
            top.key = None


class _Merge:
    """The pending key of a `<<:` merge."""


def load_text(text: str, source: str, max_depth: int = MAX_DEPTH, max_nodes: int = MAX_NODES,
              what: str = "YAML file") -> Document:
    """One YAML document from text (already decoded: use load_file for files)."""
    _printable(text, source, what)
    b = _Builder(source, max_depth, max_nodes)
    # libyaml's parser where PyYAML has it (fast, iterative); the events are the same.
    events = yaml.parse(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    while True:
        try:
            ev = next(events)
        except StopIteration:
            break
        except yaml.MarkedYAMLError as exc:
            b.fail(exc.problem_mark, f"malformed YAML: {exc.problem}")
        except yaml.YAMLError as exc:
            b.fail(None, f"malformed YAML: {exc}")
        b.event(ev)
    return b.doc
