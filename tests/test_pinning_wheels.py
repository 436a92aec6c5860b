"""First-use pinning of the wheels only AMD's index serves (issue 12, item 4), against a real
PEP 503 index on 127.0.0.1: the first build finds each wheel and records its sha256 in the user's
pins file, later builds reuse it without asking the index, `--frozen` refuses what is not locked,
and the rendered requirement makes pip itself refuse other bytes."""

from __future__ import annotations

import hashlib
import io
import json
import subprocess
import sys
import threading
import zipfile
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from test_pinning import TORCH_PINS, Server, build_dry, stack_file, wheel_name, user  # noqa: F401
from toolbox.errors import UserError
from toolbox.stack.load import load_stack


def make_wheel(name: str, version: str, filler: str = "") -> bytes:
    """A real (tiny) wheel: pip reads its METADATA when it resolves a direct URL."""
    dist = f"{name}-{version}.dist-info"
    files = {f"{name}_stub/__init__.py": f"# {filler}\n",
             f"{dist}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
             f"{dist}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: false\nTag: cp312-cp312-linux_x86_64\n"}
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        for path, text in files.items():
            zf.writestr(path, text)
        zf.writestr(f"{dist}/RECORD", "".join(f"{p},,\n" for p in [*files, f"{dist}/RECORD"]))
    return buf.getvalue()


class Index:
    """/simple/<project>/ pages linking /files/<wheel> (with or without #sha256=), and the files;
    counts page and file requests."""

    def __init__(self, fragments: bool):
        self.fragments = fragments
        self.files = {wheel_name(n, v): make_wheel(n, v) for n, v in TORCH_PINS.items()}
        # other versions and Pythons beside them, as on a real index
        self.files[wheel_name("torch", "2.10.0+rocm7.13.0")] = make_wheel("torch", "2.10.0+rocm7.13.0")
        self.files[wheel_name("torch", "2.11.0+rocm7.13.0", "cp311")] = make_wheel("torch", "2.11.0+rocm7.13.0", "311")
        self.pages = self.downloads = 0
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802
                parts = self.path.strip("/").split("/")
                if parts[0] == "simple" and len(parts) == 2:
                    outer.pages += 1
                    links = "".join(
                        f'<a href="../../files/{f.replace("+", "%2B")}'
                        + (f'#sha256={hashlib.sha256(b).hexdigest()}' if outer.fragments else "")
                        + f'">{f}</a>\n' for f, b in outer.files.items() if f.startswith(parts[1] + "-"))
                    body = f"<html><body>{links}</body></html>".encode()
                elif parts[0] == "files" and len(parts) == 2 and parts[1].replace("%2B", "+") in outer.files:
                    outer.downloads += 1
                    body = outer.files[parts[1].replace("%2B", "+")]
                else:
                    self.send_error(404)
                    return
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *a):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.base = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.url = self.base + "/simple/"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def tarball():
    s = Server()
    yield s
    s.close()


@pytest.fixture(params=[False, True], ids=["no-fragments", "fragments"])
def index(request):
    i = Index(fragments=request.param)
    yield i
    i.close()


def _torch_lines(dockerfile: str) -> list[str]:
    """The wheel requirements (the torch step installs them; later pip steps repeat them so that
    pip keeps torch as it is)."""
    lines = [ln.strip().rstrip("\\").strip() for ln in dockerfile.splitlines() if " @ http" in ln and not ln.startswith("#")]
    return list(dict.fromkeys(lines))


def test_first_build_pins_the_wheels_then_reuses_them(tmp_path, tarball, index, user):
    stack = stack_file(tmp_path, tarball.url, torch_index=index.url)
    cp = build_dry(stack)
    assert cp.returncode == 0, cp.stderr
    want = {n: hashlib.sha256(index.files[wheel_name(n, v)]).hexdigest() for n, v in TORCH_PINS.items()}
    lines = _torch_lines(cp.dockerfile)
    assert lines == [f"'{n} @ {index.base}/files/{wheel_name(n, v).replace('+', '%2B')}#sha256={want[n]}'"
                     for n, v in TORCH_PINS.items()], lines
    assert cp.stderr.count("PINNED ON FIRST USE") == 4  # the tarball and three wheels
    lock = json.loads((tmp_path / "state" / "pins.lock.json").read_text())
    assert sorted(e["sha256"] for e in lock["wheels"].values()) == sorted(want.values())
    assert index.pages == 3
    # the index's own hashes where it gives them; else each wheel downloaded once and hashed
    assert index.downloads == (0 if index.fragments else 3)
    assert f'io.github.toolbox.torch.wheel_sha256="{want["torch"]}"' in cp.dockerfile

    again = build_dry(stack, "--frozen")
    assert again.returncode == 0, again.stderr
    assert "PINNED" not in again.stderr and _torch_lines(again.dockerfile) == lines
    assert index.pages == 3 and index.downloads == (0 if index.fragments else 3)


def test_frozen_refuses_an_unpinned_wheel(tmp_path, tarball, user):
    index = Index(fragments=True)
    try:
        stack = stack_file(tmp_path, tarball.url, torch_index=index.url)
        cp = build_dry(stack, "--set", f"rocm.tarball.sha256={'c' * 64}", "--frozen")
        assert cp.returncode == 2 and "Traceback" not in cp.stderr
        assert "--frozen: torch==2.11.0+rocm7.13.0" in cp.stderr and "torch.wheels.torch" in cp.stderr
        assert index.pages == 0 and not (tmp_path / "state" / "pins.lock.json").exists()
    finally:
        index.close()


def test_no_wheel_for_the_pinned_version_is_one_line(tmp_path, tarball, user):
    index = Index(fragments=True)
    try:
        stack = stack_file(tmp_path, tarball.url, torch_index=index.url)
        cp = build_dry(stack, "--set", "torch.torch=2.12.0+rocm7.13.0")
        assert cp.returncode == 2 and "Traceback" not in cp.stderr
        assert cp.stderr.strip().splitlines()[-1].startswith(
            f"toolbox: error: {index.url}torch/: no torch 2.12.0+rocm7.13.0 wheel for cp312")
    finally:
        index.close()


def test_pip_refuses_other_bytes_than_the_pinned(tmp_path, tarball, user):
    """The rendered requirement, handed to pip itself: the pinned bytes pass, changed ones fail."""
    index = Index(fragments=False)
    try:
        stack = stack_file(tmp_path, tarball.url, torch_index=index.url)
        cp = build_dry(stack)
        assert cp.returncode == 0, cp.stderr
        req = _torch_lines(cp.dockerfile)[0].strip("'")

        def pip_download(dest):
            return subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-cache-dir",
                                   "--python-version", "3.12", "--platform", "linux_x86_64", "--only-binary=:all:",
                                   "-d", str(dest), req], capture_output=True, text=True, timeout=120)

        ok = pip_download(tmp_path / "ok")
        assert ok.returncode == 0, ok.stderr
        index.files[wheel_name("torch", TORCH_PINS["torch"])] = make_wheel("torch", TORCH_PINS["torch"], "changed")
        bad = pip_download(tmp_path / "bad")
        assert bad.returncode != 0 and "DO NOT MATCH THE HASHES" in bad.stderr
    finally:
        index.close()


WHEEL = "https://x.example/torch-2.11.0%2Brocm7.13.0-cp312-cp312-linux_x86_64.whl"


@pytest.mark.parametrize("value, message", [
    (f"{WHEEL}#sha256=", "expected '<wheel URL>#sha256=<64 hex>'"),  # the URL alone: pinned on first use
    (f"{WHEEL}#sha256={'A' * 64}", "expected '<wheel URL>#sha256=<64 hex>'"),
    (f"https://x.example/torch-2.10.0-cp312-cp312-linux_x86_64.whl#sha256={'a' * 64}",
     "the wheel is version 2.10.0, but torch.torch pins 2.11.0+rocm7.13.0"),
])
def test_bad_wheel_pins_name_the_field(value, message):
    with pytest.raises(UserError, match=r"torch\.wheels\.torch") as exc:
        load_stack("gfx1151", [f"torch.wheels.torch={value}"])
    assert message in str(exc.value)
    with pytest.raises(UserError, match="names no package"):
        load_stack("gfx1151", [f"torch.wheels.numpy={WHEEL}#sha256={'a' * 64}"])


def test_a_new_version_drops_its_wheel_pin(tmp_path):
    ref = f"{WHEEL}#sha256={'a' * 64}"
    f = tmp_path / "mine.yaml"
    f.write_text(f"extends: gfx1151\nname: mine\ntorch:\n  wheels:\n    torch: {ref}\n")
    assert load_stack(str(f)).model.torch.wheels == {"torch": ref}
    # a pin of 2.11.0's bytes says nothing about 2.12.0 (nor about another index)
    assert load_stack(str(f), ["torch.torch=2.12.0+rocm7.13.0"]).model.torch.wheels == {}
    assert load_stack(str(f), ["torch.index_url=https://mirror.example/whl/"]).model.torch.wheels == {}


def test_first_use_list_unchanged_by_wheel_pins():
    """Pinning a wheel must not make the checked-in Python lock stale (its inputs are versions)."""
    from toolbox.stack import python_lock

    plain = load_stack("gfx1151")
    pinned = load_stack("gfx1151", [f"torch.wheels.torch={WHEEL}#sha256={'a' * 64}"])
    assert python_lock.inputs_digest(pinned) == python_lock.inputs_digest(plain)
    assert python_lock.current(pinned) is not None

