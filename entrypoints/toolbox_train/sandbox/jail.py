"""One run of code and tests in the sandbox: bubblewrap's command (the namespaces and the mounts),
the process started as nobody when the caller is root, its output read with a cap, the wall clock,
and the result read from the harness's lines. Nothing here raises into the caller or waits past
`timeout` plus a few seconds of cleanup."""

from __future__ import annotations

import functools
import json
import os
import selectors
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from toolbox_train.sandbox.limits import Limits

WORK = "/sandbox"  # the sandbox's fresh tmpfs: its cwd, HOME and TMPDIR, the one writable folder
NOBODY = 65534  # the user a root caller runs the sandbox as: RLIMIT_NPROC does not bind root
# The whole environment of the sandbox (and of bwrap): fixed values, nothing read from the caller's,
# so no token, key, proxy or tracker setting can reach it.
ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": WORK, "TMPDIR": WORK, "LANG": "C.UTF-8",
       "LC_ALL": "C.UTF-8", "PYTHONIOENCODING": "utf-8", "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1",
       "MKL_NUM_THREADS": "1"}
# What is mounted read-only besides the interpreter's folders: the system's programs and libraries and
# the dynamic loader's files, nothing of /home, /root, /run, /tmp, /var, /etc's other files or the data.
SYSTEM = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
ETC = ("/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d", "/etc/localtime", "/etc/alternatives")
HARNESS = (Path(__file__).with_name("harness.py")).read_text(encoding="utf-8")
RESULT_CAP = 1 << 20  # the harness writes a line per test; more than this is the code writing there
STATUSES = ("passed", "failed", "error", "exited", "timeout", "killed", "output_limit", "sandbox_error")


@dataclass(frozen=True)
class Result:
    """How a run ended (one of STATUSES), the tests that passed, the output kept, and a detail
    (the exception the code raised, the signal, bubblewrap's message)."""

    status: str
    passed: int
    total: int
    output: str = ""
    detail: str = ""

    @property
    def score(self) -> float:
        """The fraction of the tests that passed (those a timeout or a kill let finish count)."""
        return self.passed / self.total if self.total else 0.0


def _roots(python: str) -> list[str]:
    """The interpreter's folders: its venv (bin/..) and the installation its binary resolves into."""
    out = []
    for exe in (python, os.path.realpath(python)):
        root = os.path.dirname(os.path.dirname(os.path.abspath(exe)))
        if root != "/" and not any(root == s or root.startswith(s + "/") for s in SYSTEM + tuple(out)):
            out.append(root)
    return out


def _system() -> list[str]:
    args = []
    for p in SYSTEM:
        if os.path.islink(p):
            args += ["--symlink", os.readlink(p), p]
        elif os.path.isdir(p):
            args += ["--ro-bind", p, p]
    return args


def _user() -> dict:
    """Popen's arguments that start bwrap as nobody when the caller is root."""
    return {"user": NOBODY, "group": NOBODY, "extra_groups": []} if os.geteuid() == 0 else {}


@functools.cache
def _no_nested_userns() -> tuple[str, ...]:
    """--disable-userns (no user namespace inside the sandbox) where this machine lets bwrap set it:
    it writes the new namespace's /proc/sys/user/max_user_namespaces, which a container's read-only
    /proc/sys (podman's default) refuses; there the sandbox runs without it."""
    try:
        ok = subprocess.run([shutil.which("bwrap") or "bwrap", "--unshare-user", "--disable-userns", *_system(),
                             "/usr/bin/true"], stdin=subprocess.DEVNULL, capture_output=True, cwd="/", env=dict(ENV),
                            timeout=30, **_user()).returncode == 0
    except (OSError, subprocess.SubprocessError):
        ok = False
    return ("--disable-userns",) if ok else ()


def command(limits: Limits, result_fd: int, info_fd: int) -> list[str]:
    """bwrap's argv. No new /proc: mounting one in a container whose /proc is partly masked (podman's,
    docker's) is refused, and the code needs none; --dev gives null, zero, random, urandom, tty."""
    python = limits.python or sys.executable
    args = [shutil.which("bwrap") or "bwrap", "--unshare-all", "--unshare-user", *_no_nested_userns(),
            "--die-with-parent", "--new-session", "--cap-drop", "ALL", "--info-fd", str(info_fd), *_system()]
    for p in [*(e for e in ETC if os.path.exists(e)), *_roots(python)]:
        args += ["--ro-bind", p, p]
    args += ["--dev", "/dev", "--remount-ro", "/dev", "--size", str(limits.disk_mb << 20), "--tmpfs", WORK,
             "--remount-ro", "/", "--chdir", WORK, python, "-I", "-B", "-c", HARNESS, str(result_fd)]
    return args


def _stop(proc: subprocess.Popen, info: bytes) -> int | None:
    """Kills the sandbox and returns bwrap's exit status once nothing of it runs (None: it would not die).
    The namespace's init (its pid from --info-fd) first: the kernel kills every process of the pid
    namespace before the init is gone, and bwrap, which waits for the init, exits after it. Without
    that pid, bwrap's process group (bwrap and the init; --die-with-parent also takes the init)."""
    try:
        pid = int(json.loads(info)["child-pid"])
    except (ValueError, KeyError, TypeError):
        pid = None
    kills = ([lambda: os.kill(pid, signal.SIGKILL)] if pid else []) + [lambda: os.killpg(proc.pid, signal.SIGKILL)]
    for kill in kills:
        try:
            kill()
        except (ProcessLookupError, PermissionError):
            pass
        try:
            return proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            continue
    return None  # a process the kernel cannot kill now (uninterruptible I/O): left to the kernel


def _status(lines: list[str], total: int, rc: int | None) -> tuple[str, int, str]:
    tests: dict[int, bool] = {}
    for ln in lines:
        parts = ln.split()
        if len(parts) == 3 and parts[0] == "test" and parts[1].isdigit() and int(parts[1]) < total:
            tests[int(parts[1])] = parts[2] == "1"
    passed = sum(tests.values())
    if "start" not in lines:
        return "sandbox_error", 0, f"the sandbox did not start (exit {rc})"
    if "done" in lines:
        return ("passed" if passed == total else "failed"), passed, ""
    err = next((ln[len("code error "):] for ln in lines if ln.startswith("code error ")), None)
    if err is not None:
        return "error", 0, err
    if rc is not None and rc > 128:  # bwrap passes a signal's death on as 128 + its number
        try:
            return "killed", passed, signal.Signals(rc - 128).name
        except ValueError:
            pass
    return ("killed" if rc is None or rc < 0 else "exited"), passed, f"exit {rc} before the tests finished"


def _run(code: str, tests: list[str], limits: Limits) -> Result:
    total = len(tests)
    if not shutil.which("bwrap"):
        return Result("sandbox_error", 0, total, detail="bubblewrap (bwrap) is not installed")
    job = json.dumps({"limits": limits.model_dump(), "code": code, "tests": tests}).encode()
    job_fd = os.memfd_create("sandbox-job")  # a file, not a pipe: writing the job cannot block
    r, w = os.pipe()
    info_r, info_w = os.pipe()
    try:
        with open(job_fd, "wb", closefd=False) as f:
            f.write(job)
        os.lseek(job_fd, 0, os.SEEK_SET)
        proc = subprocess.Popen(command(limits, w, info_w), stdin=job_fd, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, pass_fds=(w, info_w), cwd="/", env=dict(ENV),
                                start_new_session=True, **_user())
    except BaseException:
        os.close(r)
        os.close(info_r)
        raise
    finally:
        for fd in (w, info_w, job_fd):
            os.close(fd)
    out, res, info, why, rc = bytearray(), bytearray(), bytearray(), "", None
    cap = limits.output_kb << 10
    deadline = time.monotonic() + limits.timeout
    try:
        with selectors.DefaultSelector() as sel:
            for fd, data in ((proc.stdout.fileno(), out), (r, res), (info_r, info)):
                sel.register(fd, selectors.EVENT_READ, data)
            while sel.get_map() and not why:
                left = deadline - time.monotonic()
                if left <= 0:
                    why = "timeout"
                    break
                for key, _ in sel.select(left):
                    chunk = os.read(key.fd, 1 << 16)
                    if not chunk:
                        sel.unregister(key.fd)
                        continue
                    key.data.extend(chunk)
                    if len(out) > cap or len(res) > RESULT_CAP:
                        why = "output_limit"
                        break
        if not why:  # every pipe closed: bwrap ends with its child, or the code closed them and lives on
            try:
                rc = proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                why = "timeout"
    finally:
        if rc is None:
            rc = _stop(proc, bytes(info))
        for fd in (r, info_r):
            os.close(fd)
        proc.stdout.close()
    text = out[:cap].decode("utf-8", "replace")
    status, passed, detail = _status(res.decode("utf-8", "replace").splitlines(), total, rc)
    if why:
        status, detail = why, (f"over {limits.timeout} s" if why == "timeout" else f"over {limits.output_kb} KiB")
    elif status == "sandbox_error":
        detail = f"{detail}: {text.strip().splitlines()[-1] if text.strip() else 'no message'}"
    return Result(status, passed, total, text, detail)


def run(code: str, tests: list[str], limits: Limits | None = None) -> Result:
    """Runs `code`, then each of `tests` in its namespace, in a fresh sandbox; always a Result."""
    limits = limits or Limits()
    try:
        return _run(code, list(tests), limits)
    except Exception as exc:  # the caller is a trainer: a failure here is a zero score, never a crash
        return Result("sandbox_error", 0, len(tests), detail=f"{type(exc).__name__}: {exc}"[:300])


def probe(limits: Limits | None = None) -> str | None:
    """None when the sandbox runs here (a known program passes its test), else why not, in words."""
    r = run("x = 6 * 7", ["assert x == 42"], limits)
    if r.status == "passed":
        return None
    why = f"{r.status}: {r.detail}"
    if "bwrap" in r.detail and "not installed" in r.detail:
        why += " (Debian/Ubuntu: apt-get install bubblewrap; Fedora: dnf install bubblewrap)"
    elif "namespace" in r.detail.lower() or "uid map" in r.detail.lower():
        why += (" (user namespaces are refused here: a container's seccomp profile or the host's "
                "user.max_user_namespaces / AppArmor forbids them)")
    elif "Permission denied" in r.detail:
        why += f" (can the sandbox's user (uid {NOBODY if os.geteuid() == 0 else os.geteuid()}) reach the interpreter?)"
    return why
