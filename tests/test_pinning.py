"""First-use pinning (issue 12, item 2) against a real HTTP server on 127.0.0.1.

The server serves a fake TheRock dist tarball (with share/therock/therock_manifest.json); the
CLI path is `toolbox build --dry-run` (it pins like a build, then prints the commands), with
the user's state and cache folders pointed into tmp_path.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from toolbox.stack import pinning
from toolbox.errors import UserError

ROOT = Path(__file__).resolve().parents[1]
RCCL_COMMIT = "79e85e1468f96a867108043c953e9547c13b4c5e"  # gfx1151.yaml's rccl.commit
OTHER_COMMIT = "0f191289" + "0" * 32
NAME = "therock-dist-linux-gfx1151-7.13.0.tar.gz"


def make_tarball(commit: str, filler: bytes = b"") -> bytes:
    manifest = {"schema_version": "TheRock-Manifest.v1",
                "submodules": [{"path": "rocm-libraries", "url": "https://github.com/ROCm/rocm-libraries.git",
                                "commit": "1" * 40},
                               {"path": "rocm-systems", "url": "https://github.com/ROCm/rocm-systems.git",
                                "commit": commit}]}
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tf:
        for name, data in (("./bin/hipcc", b"#!/bin/sh\n" + filler), ("./lib/libamdhip64.so", b"\x7fELF"),
                           ("./share/therock/therock_manifest.json", json.dumps(manifest).encode())):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    return buf.getvalue()


class Server:
    """Serves self.body at /NAME and counts the requests."""

    def __init__(self):
        self.body = make_tarball(RCCL_COMMIT)
        self.hits = 0
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802
                outer.hits += 1
                if self.path != f"/{NAME}":
                    self.send_error(404)
                    return
                self.send_response(200)
                self.send_header("Content-Length", str(len(outer.body)))
                self.end_headers()
                self.wfile.write(outer.body)

            def log_message(self, *a):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/{NAME}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def server():
    s = Server()
    yield s
    s.close()


@pytest.fixture
def user(tmp_path, monkeypatch):
    """The user's state and cache folders, empty."""
    env = {"TOOLBOX_STATE_DIR": str(tmp_path / "state"), "TOOLBOX_CACHE_DIR": str(tmp_path / "cache")}
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    return env


TORCH_PINS = {"torch": "2.11.0+rocm7.13.0", "torchvision": "0.26.0+rocm7.13.0", "torchaudio": "2.11.0+rocm7.13.0"}


def wheel_name(name: str, version: str, py: str = "cp312") -> str:
    return f"{name}-{version}-{py}-{py}-linux_x86_64.whl"


def stack_file(tmp_path: Path, url: str, torch_index: str | None = None, **extra: str) -> Path:
    """gfx1151 with the tarball at `url`; torch's wheels from `torch_index`, or, without one,
    already pinned (so that these tests reach no AMD index)."""
    p = tmp_path / "mine.yaml"
    lines = ["extends: gfx1151", "name: mine", "base:", f"  digest: sha256:{'b' * 64}",
             "rocm:", "  tarball:", f"    url: {url}", "torch:"]
    if torch_index:
        lines += [f"  index_url: {torch_index}"]
    else:
        lines += ["  wheels:"] + [f"    {n}: https://repo.amd.com/rocm/whl/gfx1151/{wheel_name(n, v).replace('+', '%2B')}"
                                  f"#sha256={'e' * 64}" for n, v in TORCH_PINS.items()]
    lines += [f"{k}: {v}" for k, v in extra.items()]
    p.write_text("\n".join(lines) + "\n")
    return p


def build_dry(stack: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{ROOT / 'entrypoints'}"}
    cp = subprocess.run([sys.executable, "-m", "toolbox", "build", "--stack", str(stack), "--engine", "podman",
                         *args, "--dry-run"], capture_output=True, text=True, env=env, timeout=300, cwd=ROOT)
    for line in cp.stdout.splitlines():  # a dry run keeps its context for the printed commands
        if line.startswith("# context: "):
            dockerfile = Path(line.split(": ", 1)[1]) / "Dockerfile"
            cp.dockerfile = dockerfile.read_text()
            shutil.rmtree(dockerfile.parent.parent)
    return cp


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def test_first_build_locks_then_reuses(tmp_path, server, user):
    stack = stack_file(tmp_path, server.url)
    cp = build_dry(stack)
    assert cp.returncode == 0, cp.stderr
    want = sha(server.body)
    assert "PINNED ON FIRST USE" in cp.stderr and want in cp.stderr
    assert f"--sha256 {want}" in cp.dockerfile  # the build checks the bytes against the pin
    lock = json.loads((tmp_path / "state" / "pins.lock.json").read_text())
    assert lock["files"][server.url]["sha256"] == want
    assert lock["files"][server.url]["rocm_systems_commit"] == RCCL_COMMIT
    assert server.hits == 1

    cp = build_dry(stack)
    assert cp.returncode == 0, cp.stderr
    assert "PINNED" not in cp.stderr and f"--sha256 {want}" in cp.dockerfile
    assert server.hits == 1  # downloaded once: the cached copy and the lock are reused


def test_changed_bytes_fail_naming_both_hashes(tmp_path, server, user):
    stack = stack_file(tmp_path, server.url)
    assert build_dry(stack).returncode == 0
    old = sha(server.body)
    shutil.rmtree(tmp_path / "cache")  # a new machine, or a cleaned cache: the bytes are fetched again
    server.body = make_tarball(RCCL_COMMIT, filler=b"changed upstream")
    cp = build_dry(stack)
    assert cp.returncode == 2
    assert old in cp.stderr and sha(server.body) in cp.stderr and "changed" in cp.stderr
    assert "Traceback" not in cp.stderr
    lock = json.loads((tmp_path / "state" / "pins.lock.json").read_text())
    assert lock["files"][server.url]["sha256"] == old  # the lock keeps the first hash


def test_frozen_refuses_what_is_not_locked(tmp_path, server, user):
    stack = stack_file(tmp_path, server.url)
    cp = build_dry(stack, "--frozen")
    assert cp.returncode == 2 and "--frozen" in cp.stderr and server.url in cp.stderr
    assert server.hits == 0 and not (tmp_path / "state" / "pins.lock.json").exists()
    assert build_dry(stack).returncode == 0  # once locked, --frozen builds
    cp = build_dry(stack, "--frozen")
    assert cp.returncode == 0, cp.stderr
    assert server.hits == 1


def test_manifest_commit_must_match_rccl_commit(tmp_path, server, user):
    server.body = make_tarball(OTHER_COMMIT)
    cp = build_dry(stack_file(tmp_path, server.url))
    assert cp.returncode == 2
    assert OTHER_COMMIT in cp.stderr and RCCL_COMMIT in cp.stderr and "Traceback" not in cp.stderr
    assert not (tmp_path / "state" / "pins.lock.json").exists()  # nothing locked
    assert not pinning.cached_path(server.url).exists()  # nor kept


def test_a_set_sha256_counts_as_verified(tmp_path, server, user):
    digest = "c" * 64
    cp = build_dry(stack_file(tmp_path, server.url), "--set", f"rocm.tarball.sha256={digest}")
    assert cp.returncode == 0, cp.stderr  # no `rocm.tarball.unverified=false` needed
    assert f"--sha256 {digest}" in cp.dockerfile and server.hits == 0


def test_unreachable_host_is_one_network_line(tmp_path, user):
    cp = build_dry(stack_file(tmp_path, "http://127.0.0.1:9/" + NAME))  # discard port: refused
    assert cp.returncode != 0 and "Traceback" not in cp.stderr
    first = cp.stderr.strip().splitlines()[0]
    assert first.startswith("toolbox: error: network:") and "first use" in first
    assert not pinning.cached_path("http://127.0.0.1:9/" + NAME).parent.exists()  # nothing left behind


def test_base_digest_pinned_on_first_use(tmp_path, user):
    calls = []

    def probe(ref):
        calls.append(ref)
        return "sha256:" + "d" * 64

    lock = pinning.PinsFile()
    ref = "registry.fedoraproject.org/fedora:43"
    with pytest.raises(UserError, match="--frozen"):
        pinning.pin_image(ref, pins_file=lock, frozen=True, probe=probe)
    assert pinning.pin_image(ref, pins_file=lock, frozen=False, probe=probe) == "sha256:" + "d" * 64
    again = pinning.PinsFile()  # read back from the file
    assert pinning.pin_image(ref, pins_file=again, frozen=True, probe=probe) == "sha256:" + "d" * 64
    assert calls == [ref]
    assert str(tmp_path / "state") in str(again.path)


def test_state_lives_outside_the_package(monkeypatch, tmp_path):
    monkeypatch.delenv("TOOLBOX_STATE_DIR", raising=False)
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "xdg"))
    assert pinning.PinsFile().path == tmp_path / "xdg" / "toolbox" / "pins.lock.json"


def test_first_use_pins_are_typed_updates_applied_without_reading_the_stack_again(tmp_path, server, user, monkeypatch):
    # One parse per build: the pins come back as (field path, value), and the loaded stack takes
    # them without its files, --set texts or patch series being read again.
    from toolbox.stack import resolved, source as loader
    from toolbox.stack.load import load_stack, with_pins

    path = stack_file(tmp_path, server.url)
    stack = load_stack(str(path), ["hf.peft=0.17.1"])
    updates = pinning.first_use_pins(stack, engine="podman")
    want = sha(server.body)
    assert [(u.path, u.value) for u in updates] == [(("rocm", "tarball", "sha256"), want),
                                                    (("rocm", "tarball", "unverified"), False)]

    def no_second_read(*a, **k):
        raise AssertionError("the stack was read again")

    monkeypatch.setattr(loader.safe_yaml, "load_file", no_second_read)
    monkeypatch.setattr(loader.safe_yaml, "load_text", no_second_read)
    monkeypatch.setattr(resolved, "parse_series", no_second_read)
    pinned = with_pins(stack, updates)
    assert pinned.model.rocm.tarball.sha256 == want and not pinned.unverified_pins()
    assert pinned.model.hf.peft == "0.17.1" and pinned.rccl_series is stack.rccl_series
    assert stack.model.rocm.tarball.sha256 is None  # the loaded stack itself is left as it was
    monkeypatch.undo()
    # the same stack as the --set route of before, digest included
    again = load_stack(str(path), ["hf.peft=0.17.1", f"rocm.tarball.sha256={want}", "rocm.tarball.unverified=false"])
    assert pinned.model == again.model and pinned.digest() == again.digest()


def test_an_unset_rccl_commit_is_pinned_to_the_tarballs_manifest(tmp_path, server, user):
    # A release no public record gives the RCCL commit of (ROCm 10.1): its own TheRock manifest names it.
    from toolbox.stack.load import load_stack, with_pins

    server.body = make_tarball(OTHER_COMMIT)
    stack = load_stack(str(stack_file(tmp_path, server.url, rccl="\n  commit: null\n  unverified: true")))
    assert stack.model.rccl.commit is None
    updates = pinning.first_use_pins(stack, engine="podman")
    assert (("rccl", "commit"), OTHER_COMMIT) in [(u.path, u.value) for u in updates]
    pinned = with_pins(stack, updates)
    assert pinned.model.rccl.commit == OTHER_COMMIT and not pinned.unverified_pins()
    # ...and from the pins file on the next build, without a download
    again = pinning.first_use_pins(load_stack(str(stack_file(tmp_path, server.url, rccl="\n  commit: null\n  unverified: true"))),
                                   engine="podman")
    assert (("rccl", "commit"), OTHER_COMMIT) in [(u.path, u.value) for u in again] and server.hits == 1
