"""Every `toolbox` command under the one guard (issue 23): bad input -> exit 2 and one line naming
the flag or file; a fault (full disk) -> exit 1 and one line; a traceback only with --debug;
an output is replaced whole or not at all (toolbox.files.atomic_write)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from toolbox import cli
from toolbox.errors import ToolError, UserError
from toolbox.files import atomic_write

ROOT = Path(__file__).resolve().parents[1]


def main(capsys, *argv: str) -> tuple[int, str]:
    code = cli.main(list(argv))
    out = capsys.readouterr()
    return code, out.err


def one_line(err: str) -> bool:
    return err.count("\n") == 1 and err.endswith("\n") and "Traceback" not in err


@pytest.mark.parametrize("argv, needle", [
    (["render", "--stack", "cpu", "--bogus"], "unrecognized arguments: --bogus"),
    (["cluster"], "cluster: the following arguments are required: ACTION"),
    (["patches"], "patches: the following arguments are required: SUBCOMMAND"),
    (["build", "--engine", "nope"], "build: argument --engine: invalid choice: 'nope'"),
    (["build", "--stack", "cpu", "--tag", "Upper Case"], "build: argument --tag: 'Upper Case' is not an image reference"),
    (["build", "--stack", "cpu", "--tag", "x" * 300], "is not an image reference"),
    (["build", "--stack", "cpu", "--network", "a b"], "build: argument --network: 'a b' is not a network mode"),
    (["run", "--image", "", "--", "true"], "run: argument --image: '' is not an image reference"),
    (["run", "--name", "a;b", "--", "true"], "run: argument --name: 'a;b': use letters"),
    (["create", "--name", "-x"], "create: argument --name: expected one argument"),
    (["create", "--name=-x"], "create: argument --name: '-x': use letters"),
    (["doctor", "--name", "a b"], "doctor: argument --name: 'a b'"),
    (["cluster", "check", "--hosts", "a", "--image", "A:B"], "cluster check: argument --image: 'A:B'"),
    (["cluster", "launch", "--hosts", "a", "--container", "x/y", "--", "true"], "argument --container: 'x/y'"),
])
def test_usage_errors_are_one_line_naming_the_flag(capsys, argv, needle):
    code, err = main(capsys, *argv)
    assert code == 2 and one_line(err) and err.startswith("toolbox: error: ") and needle in err, err
    assert "--help` shows the usage" in err


@pytest.mark.parametrize("ref", ["localhost/toolbox-cpu:abc123", "docker.io/library/debian:bookworm-slim",
                                 "registry.example:5000/a/b_c.d-e:v1.2", "debian",
                                 "fedora@sha256:" + "a" * 64, "0123456789ab", "sha256:" + "f" * 64])
def test_real_image_references_pass(ref):
    from toolbox.argtypes import image_ref

    assert image_ref(ref) == ref


def test_a_message_of_several_lines_becomes_one(monkeypatch, capsys):
    from toolbox.commands import stacks

    def bad_input(args):
        raise UserError("first line\n\n   second line  \nthird")

    monkeypatch.setattr(stacks, "run", bad_input)
    code, err = main(capsys, "stacks")
    assert code == 2 and err == "toolbox: error: first line; second line; third\n"

    def fault(args):
        raise ToolError("podman failed:\nError: short-name resolution\n")

    monkeypatch.setattr(stacks, "run", fault)
    code, err = main(capsys, "stacks")
    assert code == 1 and err == "toolbox: error: podman failed:; Error: short-name resolution\n"


def test_an_os_error_is_a_fault_in_one_line_traceback_only_with_debug(monkeypatch, capsys):
    from toolbox.commands import stacks

    def disk(args):
        raise OSError(28, "No space left on device", "/var/tmp/x")

    monkeypatch.setattr(stacks, "run", disk)
    code, err = main(capsys, "stacks")
    assert code == 1 and err == "toolbox: error: /var/tmp/x: No space left on device\n"
    code, err = main(capsys, "--debug", "stacks")
    assert code == 1 and "Traceback" in err and err.endswith("toolbox: error: /var/tmp/x: No space left on device\n")


def run(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "toolbox", *argv], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)


def test_output_to_a_device_is_written_in_place_not_replaced():
    r = run("render", "--stack", "cpu", "-o", "/dev/null")
    assert r.returncode == 0 and Path("/dev/null").is_char_device(), r.stderr
    # /dev/full: every write fails with ENOSPC, a fault of the machine: exit 1, and the device stays
    r = run("render", "--stack", "cpu", "-o", "/dev/full")
    assert r.returncode == 1 and one_line(r.stderr), r.stderr
    assert "/dev/full: cannot write: No space left on device" in r.stderr
    assert Path("/dev/full").is_char_device()


def test_output_fifo_without_reader_is_refused_not_waited_on(tmp_path):
    fifo = tmp_path / "out"
    os.mkfifo(fifo)
    r = run("render", "--stack", "cpu", "-o", str(fifo))
    assert r.returncode == 2 and one_line(r.stderr) and f"{fifo}: a FIFO that nobody reads" in r.stderr
    # with a reader (opened first, not blocking: the render fits the pipe's buffer) it is written
    fd = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    try:
        r = run("render", "--stack", "cpu", "-o", str(fifo))
        got = os.read(fd, 1 << 16)
    finally:
        os.close(fd)
    assert r.returncode == 0 and b"\nFROM " in got and fifo.is_fifo(), r.stderr


def test_output_through_a_symlink_replaces_the_file_and_keeps_the_link(tmp_path):
    real, link = tmp_path / "real", tmp_path / "link"
    real.write_text("old\n")
    link.symlink_to(real)
    atomic_write(link, "new\n")
    assert link.is_symlink() and real.read_text() == "new\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link", "real"]


@pytest.fixture
def tiny_fs(tmp_path):
    """A 64 KiB tmpfs: a real full disk for the write paths (root only; CI runs as root)."""
    if os.geteuid() != 0 or not shutil.which("mount"):
        pytest.skip("mounting a tmpfs needs root")
    d = tmp_path / "tiny"
    d.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(d)], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.strip()}")
    try:
        yield d
    finally:
        subprocess.run(["umount", "-l", str(d)], check=True)


def test_full_disk_is_a_fault_and_leaves_the_old_output(tiny_fs):
    old = tiny_fs / "Dockerfile"
    old.write_bytes(b"# an existing render\n")
    (tiny_fs / "filler").write_bytes(b"x" * (56 << 10))  # what is left is less than a render
    r = run("render", "--stack", "cpu", "-o", str(old))
    assert r.returncode == 1 and one_line(r.stderr), r.stderr
    assert f"{old}: cannot write: No space left on device" in r.stderr
    assert old.read_bytes() == b"# an existing render\n"
    assert sorted(p.name for p in tiny_fs.iterdir()) == ["Dockerfile", "filler"]  # no temp file left


def test_full_disk_during_context_leaves_no_folder(tiny_fs):
    dest = tiny_fs / "ctx"
    r = run("context", "--stack", "cpu", "-o", str(dest))
    assert r.returncode == 1 and one_line(r.stderr), r.stderr
    assert f"{dest}: cannot write: No space left on device" in r.stderr
    assert list(tiny_fs.iterdir()) == []


def test_unwritable_places_are_bad_input(tmp_path):
    r = run("context", "--stack", "cpu", "-o", "/proc/toolbox-ctx")
    assert r.returncode == 2 and one_line(r.stderr) and "/proc/toolbox-ctx: cannot write" in r.stderr
    r = run("render", "--stack", "cpu", "-o", str(tmp_path))
    assert r.returncode == 2 and one_line(r.stderr) and f"{tmp_path}: is a directory" in r.stderr


@pytest.mark.parametrize("sets, blamed, place", [
    (["platform=cuda"], "--set platform=cuda: rocm: `rocm:` only belongs to platform rocm", "gfx1151.yaml:"),
    (["hf.trl=1.15.0", "platform=cpu"], "--set platform=cpu: rocm:", "gfx1151.yaml:"),
    (["hf.trl=latest"], "--set hf.trl=latest: hf.trl: must be an exact version", None),
    (["\r=1"], "--set '\\r=1': expected key.path=value", None),
])
def test_set_errors_blame_the_set_not_a_line_of_the_file(capsys, tmp_path, sets, blamed, place):
    out = tmp_path / "Dockerfile"
    out.write_text("old\n")
    code, err = main(capsys, "render", "--stack", "gfx1151", *(f"--set={s}" for s in sets), "-o", str(out))
    assert code == 2 and one_line(err) and err.startswith(f"toolbox: error: {blamed}"), err
    if place:  # the field it broke, where the file has it, comes after
        assert f"/{place}" in err and err.rstrip().endswith(")")
    assert out.read_text() == "old\n"


class _Registry:
    """A registry's v2 API as far as `bump base` asks it: a digest for any manifest."""

    def __init__(self):
        import http.server

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_HEAD(self):  # noqa: N802
                self.send_response(200)
                self.send_header("Docker-Content-Digest", "sha256:" + "ab" * 32)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *a):
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()


def test_bump_whose_relock_fails_leaves_the_stack_as_it_was(tmp_path):
    from toolbox.paths import STACKS_DIR

    shutil.copy(STACKS_DIR / "cpu.yaml", tmp_path / "cpu.yaml")
    shutil.copy(STACKS_DIR / "cpu.pylock.txt", tmp_path / "cpu.pylock.txt")
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    reg = _Registry()
    try:
        # trixie's Python 3.13 changes the lock's inputs: bump relocks, and uv has no index to ask
        env = {**os.environ, "UV_INDEX_URL": "http://127.0.0.1:9/simple", "UV_NO_CACHE": "1", "UV_OFFLINE": "1",
               "PIP_FIND_LINKS": ""}
        r = subprocess.run([sys.executable, "-m", "toolbox", "bump", "base", "--stack", str(tmp_path / "cpu.yaml"),
                            "--to", "trixie-slim", "--registry-url", reg.url], cwd=ROOT, capture_output=True,
                           text=True, timeout=300, env=env)
    finally:
        reg.httpd.shutdown()
        reg.httpd.server_close()
    assert r.returncode == 1 and one_line(r.stderr), r.stderr
    assert "left as it was" in r.stderr and "uv could not lock" in r.stderr
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before


@pytest.mark.parametrize("args, needle", [
    (["base", "--to", "x y"], "argument --to: 'x y' is not a version"),
    (["bitsandbytes", "--to=-oProxy"], "argument --to: '-oProxy'"),
    (["rocm", "--index-url", "http://a b/"], "argument --index-url: 'http://a b/' is not"),
    (["base", "--registry-url", "ftp://x"], "argument --registry-url: 'ftp://x' is not"),
])
def test_bump_arguments(capsys, args, needle):
    code, err = main(capsys, "bump", *args, "--stack", "gfx1151")
    assert code == 2 and one_line(err) and needle in err, err


@pytest.mark.parametrize("argv, needle", [
    (["render", "--stack", "cpu", "--set=--"], "--set --: expected key.path=value"),
    (["build", "--stack", "cpu", "--wheelhouse=--", "--dry-run"], "--wheelhouse --: not a directory"),
    (["run", "--stack", "cpu", "--workspace=--", "--dry-run", "--", "true"], "--workspace --: not a directory"),
])
def test_a_double_dash_value_is_a_value(capsys, argv, needle):
    # argparse turned `--opt=--` into an empty list, which crashed the commands (AttributeError)
    code, err = main(capsys, *argv)
    assert code == 2 and one_line(err) and needle in err, err


def test_a_dry_run_creates_nothing(capsys, tmp_path):
    cache = tmp_path / "not" / "yet"
    code, err = main(capsys, "run", "--stack", "cpu", "--engine", "podman", "--hf-cache", str(cache), "--dry-run",
                     "--", "true")
    assert code == 0, err
    assert list(tmp_path.iterdir()) == []  # the real run makes the cache folder, not the dry one


def test_build_context_folder_left_as_it_was_when_the_disk_is_full(tiny_fs):
    ctx = tiny_fs / "ctx"
    ctx.mkdir()  # an empty folder of the user's: filled whole, or left as it was
    r = run("build", "--stack", "cpu", "--engine", "podman", "--context", str(ctx), "--dry-run")
    assert r.returncode == 1 and one_line(r.stderr) and "No space left on device" in r.stderr, r.stderr
    assert [p.name for p in tiny_fs.iterdir()] == ["ctx"] and list(ctx.iterdir()) == []
    r = run("build", "--stack", "cpu", "--engine", "podman", "--context", "/etc/hostname", "--dry-run")
    assert r.returncode == 2 and "--context /etc/hostname: exists and is not an empty folder" in r.stderr


def test_sigterm_cleans_up_and_exits_143(tmp_path):
    """SIGTERM in the middle of `toolbox lock` (uv running, a stand-in that waits): exit 143, one
    line, the lock as it was, no temporary folder left; uv itself is stopped too."""
    import signal

    from toolbox.paths import STACKS_DIR

    stacks, tmp, bin_dir = tmp_path / "stacks", tmp_path / "tmp", tmp_path / "bin"
    for d in (stacks, tmp, bin_dir):
        d.mkdir()
    shutil.copy(STACKS_DIR / "cpu.yaml", stacks / "cpu.yaml")
    shutil.copy(STACKS_DIR / "cpu.pylock.txt", stacks / "cpu.pylock.txt")
    before = (stacks / "cpu.pylock.txt").read_bytes()
    started = tmp_path / "uv-started"
    (bin_dir / "uv").write_text(f"#!/bin/sh\necho $$ > {started}\nexec sleep 600\n")
    (bin_dir / "uv").chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "TMPDIR": str(tmp)}
    proc = subprocess.Popen([sys.executable, "-m", "toolbox", "lock", "--stack", str(stacks / "cpu.yaml")],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        while not (started.exists() and started.read_text().strip()):  # uv runs: toolbox is inside compile_lock
            assert proc.poll() is None, proc.communicate()
            threading.Event().wait(0.05)
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 143 and err == "toolbox: terminated (SIGTERM)\n", (proc.returncode, err)
    assert (stacks / "cpu.pylock.txt").read_bytes() == before
    assert list(tmp.iterdir()) == []  # compile_lock's temporary folder went
    uv_pid = int(started.read_text())
    with pytest.raises(ProcessLookupError):
        for _ in range(600):  # subprocess.run kills uv on the way out; reaped by then
            os.kill(uv_pid, 0)
            threading.Event().wait(0.1)


def test_sigterm_during_a_build_stops_the_engine_and_removes_the_context(tmp_path):
    """podman here is a stand-in that streams and waits: the real one cannot be stopped on cue.
    toolbox hands the SIGTERM on, waits for it, removes its temporary build context, exits 143."""
    import signal

    tmp, bin_dir = tmp_path / "tmp", tmp_path / "bin"
    tmp.mkdir()
    bin_dir.mkdir()
    got = tmp_path / "podman-got"
    (bin_dir / "podman").write_text(
        "#!/bin/bash\n"
        '[ "$1" = build ] || exit 0\n'
        f"trap 'echo TERM > {got}; exit 143' TERM\n"
        f"echo started > {got}\n"
        "echo 'STEP 1/9: FROM x'\n"
        "while true; do sleep 0.1; done\n")
    (bin_dir / "podman").chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "TMPDIR": str(tmp)}
    proc = subprocess.Popen([sys.executable, "-m", "toolbox", "build", "--stack", "cpu", "--engine", "podman"],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        while not (got.exists() and got.read_text() == "started\n"):
            assert proc.poll() is None, proc.communicate()
            threading.Event().wait(0.05)
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 143 and err.endswith("toolbox: terminated (SIGTERM)\n"), (proc.returncode, err)
    assert got.read_text() == "TERM\n"  # the engine was told, not orphaned
    assert list(tmp.iterdir()) == []  # the build context and the iidfile folder went
