"""The files toolbox keeps between runs - the first-use pins file and the Python locks - each
with a schema (pydantic) and a checksum: a truncated, hand-edited or otherwise damaged one is
refused (exit 2) naming the file, what is wrong and how to make it again, instead of crashing
later (AttributeError), passing `toolbox lock --check`, or letting `--frozen` reach the network.

The checksum is the sha256 of the content without it: of the JSON document without its
"checksum" key (canonical form: sorted keys, no spaces), or of the lock's lines without its
`# checksum:` line. It guards against accidents (a cut-off write, an editor), not an attacker
who can write the user's files.
"""

from __future__ import annotations

import hashlib
import json
import re
import stat
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from toolbox.errors import UserError

MAX_BYTES = 64 << 20  # far above any real pins file or lock; a bound, not a guess at the size
SHA256 = r"[0-9a-f]{64}"
Sha256 = Annotated[str, Field(pattern=rf"^{SHA256}$")]
Stamp = Annotated[str, Field(pattern=r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$")]


class Damaged(UserError):
    """A state file that cannot be trusted: names it, says why and how to regenerate it."""

    def __init__(self, path: Path, what: str, why: str, regenerate: str):
        super().__init__(f"{path}: damaged {what}: {why}; {regenerate}")


def read_bytes(path: Path, what: str, regenerate: str) -> bytes:
    """The file's bytes; a FIFO, a folder or a file beyond MAX_BYTES is refused, not read."""
    try:
        st = path.stat()
        if not stat.S_ISREG(st.st_mode):
            raise Damaged(path, what, "not a regular file", regenerate)
        if st.st_size > MAX_BYTES:
            raise Damaged(path, what, f"{st.st_size} bytes, more than such a file ever holds", regenerate)
        return path.read_bytes()
    except OSError as exc:
        raise UserError(f"{path}: cannot read the {what}: {exc.strerror}") from None


def _first_error(exc: ValidationError) -> str:
    err = exc.errors()[0]
    loc = ".".join(str(p) for p in err["loc"]) or "<top>"
    more = f" (and {exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
    return f"{loc}: {err['msg']}{more}"


# -- the pins file (JSON) ---------------------------------------------------------------------
class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class FilePin(_Strict):
    sha256: Sha256
    locked: Stamp
    rocm_systems_commit: Annotated[str, Field(pattern=r"^[0-9a-f]{7,64}$")] | None = None


class ImagePin(_Strict):
    digest: Annotated[str, Field(pattern=rf"^sha256:{SHA256}$")]
    locked: Stamp


class WheelPin(_Strict):
    url: Annotated[str, Field(pattern=r"^https?://\S+\.whl$")]
    sha256: Sha256
    locked: Stamp


class PinsDocument(_Strict):
    format: Literal[1]
    checksum: Annotated[str, Field(pattern=rf"^sha256:{SHA256}$")]
    files: dict[Annotated[str, Field(pattern=r"^\S+$")], FilePin]
    images: dict[Annotated[str, Field(pattern=r"^\S+$")], ImagePin]
    wheels: dict[Annotated[str, Field(pattern=r"^\S+ \S+==\S+ cp\d+$")], WheelPin]


def json_checksum(doc: dict) -> str:
    body = {k: v for k, v in doc.items() if k != "checksum"}
    text = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return "sha256:" + hashlib.sha256(text.encode("utf-8")).hexdigest()


def pins_regenerate(path: Path) -> str:
    return (f"delete it (rm {path}) and build again: what it held is pinned again on first use "
            "(--frozen refuses until then)")


def load_pins(path: Path) -> dict:
    """The pins file's content ({"files", "images", "wheels"}), checked; Damaged otherwise."""
    what, again = "pins file", pins_regenerate(path)
    raw = read_bytes(path, what, again)
    try:
        doc = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise Damaged(path, what, f"not UTF-8 text (byte {exc.start})", again) from None
    except json.JSONDecodeError as exc:
        end = " (cut off?)" if exc.pos >= len(raw.rstrip()) else ""
        raise Damaged(path, what, f"not JSON at line {exc.lineno} column {exc.colno}: {exc.msg}{end}", again) from None
    except (ValueError, RecursionError):
        raise Damaged(path, what, "not JSON", again) from None
    if not isinstance(doc, dict):
        raise Damaged(path, what, f"a JSON {type(doc).__name__}, not an object", again)
    if "checksum" not in doc:
        raise Damaged(path, what, "no checksum (written by an older toolbox, or by hand)", again)
    if doc["checksum"] != json_checksum(doc):
        raise Damaged(path, what, "its checksum does not match its content (edited by hand, or damaged)", again)
    try:
        PinsDocument.model_validate(doc)
    except ValidationError as exc:
        raise Damaged(path, what, _first_error(exc), again) from None
    return {k: doc[k] for k in ("files", "images", "wheels")}


def dump_pins(content: dict) -> str:
    """The pins file's text for content {"files", "images", "wheels"}, with format and checksum;
    checked against the schema first (a bug must not write a file the next run refuses)."""
    doc = {"format": 1, "files": content.get("files", {}), "images": content.get("images", {}),
           "wheels": content.get("wheels", {})}
    doc["checksum"] = json_checksum(doc)
    PinsDocument.model_validate(doc)
    return json.dumps(doc, indent=2, sort_keys=True) + "\n"


# -- the Python lock (uv pip compile's text, with toolbox's header) ----------------------------
CHECKSUM_RE = re.compile(r"^# checksum: sha256:([0-9a-f]{64})\n", re.M)
_REQ = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)(\[[A-Za-z0-9._,-]*\])?==([A-Za-z0-9.+!_-]+)( \\)?$")
_HASH = re.compile(rf"^    --hash=sha256:({SHA256})( \\)?$")


class LockPackage(_Strict):
    version: Annotated[str, Field(min_length=1)]
    hashes: Annotated[list[Sha256], Field(min_length=1)]


class PythonLock(_Strict):
    inputs: Sha256
    torch_inputs: Sha256
    first_use: list[str]
    packages: Annotated[dict[str, LockPackage], Field(min_length=1)]


def without_checksum(text: str) -> str:
    return CHECKSUM_RE.sub("", text, count=1)


def lock_checksum(text: str) -> str:
    return hashlib.sha256(without_checksum(text).encode("utf-8")).hexdigest()


def with_checksum(text: str) -> str:
    """The lock's text with its `# checksum:` line, placed after the header's `# torch inputs:`."""
    text = without_checksum(text)
    line = f"# checksum: sha256:{hashlib.sha256(text.encode('utf-8')).hexdigest()}\n"
    m = re.search(r"^# torch inputs: [0-9a-f]{64}\n", text, re.M)
    at = m.end() if m else 0
    return text[:at] + line + text[at:]


def lock_regenerate(path: Path, command: str | None) -> str:
    """How to make the lock again; `command` is the `toolbox lock ...` that wrote it."""
    cmd = command or "toolbox lock --stack STACK"
    if "pylocks" in path.parts:  # the user's lock of a --set pin set: nothing else points at it
        return f"delete it (rm {path}) and run `{cmd}` again"
    return f"run `{cmd}` to write it again (or restore it from git)"


def parse_lock(text: str, path: Path, regenerate: str) -> PythonLock:
    """The lock as data; Damaged naming the line of the first thing that is not a lock's."""
    what = "Python lock"
    m = CHECKSUM_RE.search(text)
    if m is None:
        raise Damaged(path, what, "no `# checksum:` line (written by an older toolbox, or by hand)", regenerate)
    if m.group(1) != lock_checksum(text):
        raise Damaged(path, what, "its checksum does not match its content (edited by hand, or cut off)", regenerate)
    header: dict[str, object] = {"first_use": []}
    packages: dict[str, dict] = {}
    current, open_entry = None, False
    for n, line in enumerate(text.split("\n"), 1):
        s = line.strip()
        if not s:
            continue
        if open_entry and not (_HASH.match(line)):
            raise Damaged(path, what, f"line {n}: the entry of {current} ends with `\\` but no --hash follows",
                          regenerate)
        if s.startswith("#"):
            for key, rx in (("inputs", r"# inputs: (\S+)$"), ("torch_inputs", r"# torch inputs: (\S+)$")):
                if (hm := re.match(rx, s)) and line.startswith("#"):
                    header[key] = hm.group(1)
            if s.startswith("# first-use: "):
                header["first_use"].append(s.removeprefix("# first-use: ").split(" from ", 1)[0])
            continue
        if rm := _REQ.match(line):
            current = rm.group(1).lower().replace("_", "-")
            if current in packages:
                raise Damaged(path, what, f"line {n}: {current} is listed twice", regenerate)
            packages[current] = {"version": rm.group(3), "hashes": []}
            open_entry = bool(rm.group(4))
            continue
        if (hm := _HASH.match(line)) and current is not None:
            packages[current]["hashes"].append(hm.group(1))
            open_entry = bool(hm.group(2))
            continue
        raise Damaged(path, what, f"line {n}: {s[:60]!r} is neither a `name==version` nor a `--hash=sha256:` line",
                      regenerate)
    if open_entry:
        raise Damaged(path, what, f"it ends inside the entry of {current} (cut off?)", regenerate)
    try:
        return PythonLock.model_validate({**header, "packages": packages})
    except ValidationError as exc:
        raise Damaged(path, what, _first_error(exc).replace("packages.", "package "), regenerate) from None


def load_lock(path: Path, command: str | None = None) -> tuple[str, PythonLock]:
    """(text, parsed) of a lock file, checked; Damaged otherwise (`command` wrote it)."""
    again = lock_regenerate(path, command)
    raw = read_bytes(path, "Python lock", again)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise Damaged(path, "Python lock", f"not UTF-8 text (byte {exc.start})", again) from None
    return text, parse_lock(text, path, again)
