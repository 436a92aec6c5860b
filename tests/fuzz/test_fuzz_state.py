"""Fuzzing the files toolbox keeps (issue 23): the first-use pins file and a Python lock, cut,
flipped, edited with and without their checksum made to fit.

Properties: reading one either gives data of the schema's shape or refuses it with UserError
naming the file (exit 2 through the CLI, one line, no traceback); nothing else escapes, and a
refusal changes nothing on disk. Bounded budget (CI): TOOLBOX_FUZZ_EXAMPLES (default 100) per
property, derandomized unless TOOLBOX_FUZZ=random.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from toolbox import cli
from toolbox.errors import UserError
from toolbox.paths import STACKS_DIR
from toolbox.stack import pinning, statefiles

EXAMPLES = int(os.environ.get("TOOLBOX_FUZZ_EXAMPLES", "100"))
FUZZ = settings(max_examples=EXAMPLES, deadline=None, database=None,
                derandomize=os.environ.get("TOOLBOX_FUZZ") != "random",
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

STAMP = "2026-12-04T10:00:00Z"
GOOD_PINS = statefiles.dump_pins({
    "files": {"https://repo.amd.com/rocm/tarball/therock-dist-linux-gfx1151-7.13.0.tar.gz":
              {"sha256": "a" * 64, "locked": STAMP, "rocm_systems_commit": "79e85e1468f96a867108043c953e9547c13b4c5e"}},
    "images": {"registry.fedoraproject.org/fedora:43": {"digest": "sha256:" + "b" * 64, "locked": STAMP}},
    "wheels": {"https://repo.amd.com/rocm/whl/gfx1151/ torch==2.11.0+rocm7.13.0 cp312":
               {"url": "https://repo.amd.com/rocm/whl/gfx1151/torch-2.11.0%2Brocm7.13.0-cp312-cp312-linux_x86_64.whl",
                "sha256": "c" * 64, "locked": STAMP}},
})
LOCK = (STACKS_DIR / "cpu.pylock.txt").read_text()
JSON_VALUES = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=70),
                           lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
                           max_leaves=6)


def _paths(doc, prefix=()):
    yield prefix
    if isinstance(doc, dict):
        for k, v in doc.items():
            yield from _paths(v, prefix + (k,))


def _mutate_bytes(data: st.DataObject, raw: bytes) -> bytes:
    kind = data.draw(st.sampled_from(["cut", "flip", "insert", "delete"]), "byte mutation")
    pos = data.draw(st.integers(0, len(raw)), "at")
    if kind == "cut":
        return raw[:pos]
    if kind == "flip" and pos < len(raw):
        return raw[:pos] + bytes([raw[pos] ^ data.draw(st.integers(1, 255))]) + raw[pos + 1:]
    if kind == "insert":
        return raw[:pos] + data.draw(st.binary(min_size=1, max_size=8)) + raw[pos:]
    return raw[:pos] + raw[pos + data.draw(st.integers(1, 40)):]


def _mutate_pins(data: st.DataObject) -> bytes:
    if data.draw(st.booleans(), "bytes or JSON"):
        return _mutate_bytes(data, GOOD_PINS.encode())
    doc = json.loads(GOOD_PINS)
    path = data.draw(st.sampled_from(list(_paths(doc))[1:]), "field")
    node = doc
    for k in path[:-1]:
        node = node[k]
    if data.draw(st.booleans(), "drop or replace"):
        del node[path[-1]]
    else:
        node[path[-1]] = data.draw(JSON_VALUES, "value")
    if data.draw(st.booleans(), "checksum made to fit"):
        doc["checksum"] = statefiles.json_checksum(doc)
    return json.dumps(doc).encode()


@FUZZ
@given(data=st.data())
def test_damaged_pins_files(data):
    raw = _mutate_pins(data)
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "pins.lock.json"
        path.write_bytes(raw)
        try:
            pins = pinning.PinsFile(path)
        except UserError as exc:
            assert str(exc).startswith(f"{path}: damaged pins file: ") and f"rm {path}" in str(exc), str(exc)
            assert "\n" not in str(exc)
        else:
            # accepted: of the schema's shape, every entry usable as the pinning code uses it
            for url, entry in pins.data["files"].items():
                assert len(pins.file(url)["sha256"]) == 64 and entry["locked"]
            for ref in pins.data["images"]:
                assert pins.image(ref)["digest"].startswith("sha256:")
            for entry in pins.data["wheels"].values():
                assert entry["url"].endswith(".whl") and len(entry["sha256"]) == 64
        assert path.read_bytes() == raw


def _mutate_lock(data: st.DataObject) -> str:
    kind = data.draw(st.sampled_from(["bytes", "line", "edit"]), "lock mutation")
    if kind == "bytes":
        return _mutate_bytes(data, LOCK.encode()).decode("utf-8", "surrogateescape")
    lines = LOCK.split("\n")
    i = data.draw(st.integers(0, len(lines) - 1), "line")
    if kind == "line":
        how = data.draw(st.sampled_from(["drop", "twice", "swap"]))
        if how == "drop":
            del lines[i]
        elif how == "twice":
            lines.insert(i, lines[i])
        elif i + 1 < len(lines):
            lines[i], lines[i + 1] = lines[i + 1], lines[i]
    else:
        lines[i] = data.draw(st.sampled_from(["", "x==", "torch==9.9 \\", "    --hash=sha256:" + "0" * 64,
                                              "    --hash=md5:00", "-e git+https://example/x", "# inputs: 00",
                                              "--index-url http://evil/simple", lines[i].upper()]))
    text = "\n".join(lines)
    return statefiles.with_checksum(text) if data.draw(st.booleans(), "checksum made to fit") else text


@FUZZ
@given(data=st.data())
def test_damaged_python_locks_through_lock_check(data):
    text = _mutate_lock(data)
    with tempfile.TemporaryDirectory() as d:
        folder = Path(d)
        shutil.copy(STACKS_DIR / "cpu.yaml", folder / "cpu.yaml")
        lock = folder / "cpu.pylock.txt"
        lock.write_bytes(text.encode("utf-8", "surrogateescape"))
        before = lock.read_bytes()
        err, out = io.StringIO(), io.StringIO()
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
            code = cli.main(["lock", "--stack", str(folder / "cpu.yaml"), "--check"])
        err = err.getvalue()
        assert code in (0, 2) and "Traceback" not in err and "internal error" not in err, (code, err)
        if code == 2:
            assert err.count("\n") == 1 and err.startswith(f"toolbox: error: {lock}: "), err
        else:
            # accepted: parses, its checksum holds, and it holds every pin of the stack
            statefiles.load_lock(lock)
        assert lock.read_bytes() == before
