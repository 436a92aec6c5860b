"""The files toolbox keeps - the first-use pins file and the Python locks - have a schema and a
checksum (issue 23): a truncated, hand-edited or otherwise damaged one is refused with exit 2,
one line naming the file and how to make it again; it never crashes, never passes
`toolbox lock --check`, and `--frozen` never goes to the network because of it.

Real files throughout: a pins file written by a real first use (a local HTTP server stands in
for AMD's), the shipped locks copied and then damaged on disk.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from test_pinning import RCCL_COMMIT, build_dry, server, stack_file, user  # noqa: F401 (fixtures)

from toolbox.paths import STACKS_DIR
from toolbox.stack import pinning, statefiles
from toolbox.stack.statefiles import Damaged

ROOT = Path(__file__).resolve().parents[1]


def toolbox(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "toolbox", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=300, env={**os.environ, **(env or {})})


def assert_damaged(r: subprocess.CompletedProcess, path: Path, *needles: str) -> None:
    assert r.returncode == 2, (r.returncode, r.stdout[-2000:], r.stderr[-2000:])
    assert r.stderr.count("\n") == 1 and "Traceback" not in r.stderr, r.stderr
    assert f"{path}: damaged" in r.stderr, r.stderr
    for needle in needles:
        assert needle in r.stderr, r.stderr


# -- the pins file --------------------------------------------------------------------------------
@pytest.fixture
def pinned(tmp_path, server, user):  # noqa: F811 (fixtures from test_pinning)
    """A stack whose tarball was pinned on first use: (stack file, pins file, its good bytes)."""
    stack = stack_file(tmp_path, server.url)
    r = build_dry(stack)
    assert r.returncode == 0, r.stderr
    pins = tmp_path / "state" / "pins.lock.json"
    doc = json.loads(pins.read_text())
    assert doc["format"] == 1 and doc["checksum"] == statefiles.json_checksum(doc)
    assert doc["files"][server.url]["rocm_systems_commit"] == RCCL_COMMIT
    return stack, pins, pins.read_bytes()


def _edit(doc_bytes: bytes, change, fix_checksum: bool) -> bytes:
    doc = json.loads(doc_bytes)
    change(doc)
    if fix_checksum:
        doc["checksum"] = statefiles.json_checksum(doc)
    return json.dumps(doc).encode()


def _sha_edit(doc):
    url = next(iter(doc["files"]))
    doc["files"][url]["sha256"] = "0" * 64


DAMAGES = {
    "truncated": (lambda b: b[: len(b) // 2], "cut off?"),
    "empty": (lambda b: b"", "not JSON"),
    "binary": (lambda b: b"\x89PNG\r\n\x1a\n\x00\x00", "not UTF-8"),
    "a JSON list": (lambda b: b"[]", "a JSON list, not an object"),
    "hand-edited hash": (lambda b: _edit(b, _sha_edit, False), "checksum does not match"),
    "older file without checksum": (lambda b: _edit(b, lambda d: d.pop("checksum"), False), "no checksum"),
    # the checksum made to fit: the schema still refuses what would crash (AttributeError) later
    "files as a list": (lambda b: _edit(b, lambda d: d.update(files=[]), True), "files: Input should be a valid dictionary"),
    "entry without sha256": (lambda b: _edit(b, lambda d: [e.pop("sha256") for e in d["files"].values()], True),
                             "sha256: Field required"),
    "short hash": (lambda b: _edit(b, lambda d: [e.update(sha256="abc") for e in d["files"].values()], True),
                   "sha256: String should match pattern"),
    "unknown key": (lambda b: _edit(b, lambda d: d.update(extra={}), True), "extra: Extra inputs are not permitted"),
}


@pytest.mark.parametrize("kind", sorted(DAMAGES))
def test_damaged_pins_file_is_refused_by_build_and_frozen_reaches_no_network(pinned, server, kind):
    stack, pins, good = pinned
    damage, needle = DAMAGES[kind]
    pins.write_bytes(damage(good))
    before = pins.read_bytes()
    hits = server.hits
    for extra in ((), ("--frozen",)):
        r = build_dry(stack, *extra)
        assert_damaged(r, pins, needle, f"rm {pins}")
    assert server.hits == hits  # nothing fetched: not for --frozen, not to re-pin
    assert pins.read_bytes() == before  # left as it was, for the user to look at
    with pytest.raises(Damaged):
        pinning.PinsFile(pins)


def test_pins_file_that_is_not_a_file(tmp_path, user):  # noqa: F811
    pins = tmp_path / "state" / "pins.lock.json"
    pins.parent.mkdir(parents=True)
    os.mkfifo(pins)  # reading it would wait for a writer for ever
    with pytest.raises(Damaged, match="not a regular file"):
        pinning.PinsFile(pins)
    pins.unlink()
    pins.mkdir()
    with pytest.raises(Damaged, match="not a regular file"):
        pinning.PinsFile(pins)


def test_regenerating_as_told_works(pinned, server):
    stack, pins, good = pinned
    pins.write_bytes(good[:-20])
    r = build_dry(stack)
    assert r.returncode == 2 and f"rm {pins}" in r.stderr
    pins.unlink()  # what the message says
    r = build_dry(stack)
    assert r.returncode == 0 and "PINNED ON FIRST USE" in r.stderr, r.stderr
    (url, now), = json.loads(pins.read_bytes())["files"].items()
    assert now["sha256"] == json.loads(good)["files"][url]["sha256"]


def test_frozen_with_a_pin_uses_it_without_downloading(pinned, server, tmp_path):
    stack, pins, good = pinned
    shutil.rmtree(tmp_path / "cache")  # a new machine with the user's pins file
    hits = server.hits
    r = build_dry(stack, "--frozen")
    assert r.returncode == 0, r.stderr
    assert server.hits == hits  # --frozen takes the recorded hash; the image's build checks the bytes


def test_written_pins_file_round_trips(tmp_path):
    path = tmp_path / "pins.lock.json"
    f = pinning.PinsFile(path)
    f.data["images"]["registry.example/x:1"] = {"digest": "sha256:" + "d" * 64, "locked": "2026-12-04T10:00:00Z"}
    f.save()
    assert pinning.PinsFile(path).image("registry.example/x:1")["digest"] == "sha256:" + "d" * 64
    f.data["images"]["bad"] = {"digest": "latest", "locked": "now"}
    with pytest.raises(Exception):
        f.save()  # a bug must not write a file the next run refuses
    assert pinning.PinsFile(path).image("bad") is None


# -- the Python lock ----------------------------------------------------------------------------
@pytest.fixture
def cpu_copy(tmp_path):
    """The cpu stack and its lock, copied: a stack file outside the package with its own lock."""
    d = tmp_path / "stacks"
    d.mkdir()
    shutil.copy(STACKS_DIR / "cpu.yaml", d / "cpu.yaml")
    shutil.copy(STACKS_DIR / "cpu.pylock.txt", d / "cpu.pylock.txt")
    r = toolbox("lock", "--stack", str(d / "cpu.yaml"), "--check")
    assert r.returncode == 0 and "current" in r.stdout, r.stderr
    return d / "cpu.yaml", d / "cpu.pylock.txt"


def _drop_package(text: str, name: str) -> str:
    lines, out, skip = text.split("\n"), [], False
    for line in lines:
        if line.startswith(f"{name}=="):
            skip = True
            continue
        if skip and (line.startswith("    ") or not line):
            continue
        skip = False
        out.append(line)
    return "\n".join(out)


LOCK_DAMAGES = {
    "truncated in an entry": (lambda t: t[: t.index("--hash=", len(t) // 2) + 20], "checksum does not match"),
    "truncated, checksum fixed": (lambda t: statefiles.with_checksum(t[: t.index(" \\\n    --hash=", len(t) // 2) + 2]),
                                  "ends inside the entry"),
    "a hash edited": (lambda t: t.replace("--hash=sha256:5", "--hash=sha256:6", 1), "checksum does not match"),
    "no checksum (older lock)": (statefiles.without_checksum, "no `# checksum:` line"),
    "a package dropped, checksum fixed": (lambda t: statefiles.with_checksum(_drop_package(t, "transformers")),
                                          "does not hold transformers==5.17.0"),
    "garbage line, checksum fixed": (lambda t: statefiles.with_checksum(t + "rm -rf /\n"), "is neither"),
    "binary": (lambda t: "\udcff\x00", "not UTF-8"),
}


@pytest.mark.parametrize("kind", sorted(LOCK_DAMAGES))
def test_damaged_python_lock_fails_check_build_and_render(cpu_copy, kind):
    stack, lock = cpu_copy
    damage, needle = LOCK_DAMAGES[kind]
    lock.write_bytes(damage(lock.read_text()).encode("utf-8", "surrogateescape"))
    before = lock.read_bytes()
    again = f"toolbox lock --stack {stack}"
    assert_damaged(toolbox("lock", "--stack", str(stack), "--check"), lock, needle, again)
    assert_damaged(toolbox("build", "--stack", str(stack), "--dry-run", "--frozen"), lock, needle, again)
    assert_damaged(toolbox("build", "--stack", str(stack), "--dry-run", "--unlocked"), lock, needle)
    assert_damaged(toolbox("render", "--stack", str(stack)), lock, needle)
    assert lock.read_bytes() == before


def test_shipped_locks_carry_a_checksum_that_holds():
    for p in sorted(STACKS_DIR.glob("*.pylock.txt")):
        text, lock = statefiles.load_lock(p, p.stem)
        assert len(lock.packages) > 20 and statefiles.CHECKSUM_RE.search(text), p


def test_a_damaged_user_lock_of_a_set_names_the_set(tmp_path, user, cpu_copy):  # noqa: F811
    from toolbox.stack import python_lock
    from toolbox.stack.load import load_stack

    stack_path, _ = cpu_copy
    over = "hf.peft=0.18.0"
    stack = load_stack(str(stack_path), [over])
    path = python_lock.user_lock_path(stack)
    path.parent.mkdir(parents=True)
    # a lock claiming this pin set's inputs but holding the file's peft: not the lock of this set
    text = (STACKS_DIR / "cpu.pylock.txt").read_text()
    old = python_lock.INPUTS_RE.search(text).group(1)
    path.write_text(statefiles.with_checksum(text.replace(old, python_lock.inputs_digest(stack))))
    r = toolbox("lock", "--stack", str(stack_path), "--set", over, "--check")
    assert_damaged(r, path, "does not hold peft==0.18.0", f"rm {path}", f"--set {over}")
