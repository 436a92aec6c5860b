"""HOSTSPY=1 (vision_rows.py, issue 44): where the host's time goes in a row's timed steps, sampled from outside
the process by py-spy (`py-spy record --pid`, nonblocking: the process is never paused). torch.profiler's Python
stacks (PROFILE_STACKS=1) slowed the profiled steps 1.4-1.75x on 2026-12-07 and came back empty; a sampler in
another process costs the row a core of the machine's, not its own time.

`Spy.start()` at the start of the timed window (the Clock's, or the bare loop's), `Spy.stop()` at its end: the row
gets `hostspy`, its main thread's samples summed three ways - by the package of the innermost Python frame
(`self`: the Python, or the C++ op, the host was in), by every package on the stack (`under`: e.g. all the time
inside TRL's loss, or Liger's Functions), and the innermost frames (file:line function) that took the most samples.
Waits count where the thread waits (`--idle`): a host sync shows as the line that synced. The raw stacks are kept
as `hostspy-*.txt` beside the row's log. Needs the `py-spy` binary on PATH (the device call's site tarball has it
in bin/); without it the row says so and runs unsampled.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

_RATE = os.environ.get("HOSTSPY_RATE", "500")
if not _RATE.isdigit() or int(_RATE) < 1:
    print(f"HOSTSPY_RATE={_RATE}: a whole number of samples a second, 1 or more", file=sys.stderr)
    raise SystemExit(2)
RATE = int(_RATE)  # samples a second
TOP = 40
# package -> the path part that names it (checked in this order: the innermost match wins)
PACKAGES = (("liger_kernel", "/liger_kernel/"), ("triton", "/triton/"), ("trl", "/trl/"), ("peft", "/peft/"),
            ("accelerate", "/accelerate/"), ("transformers", "/transformers/"), ("toolbox_train", "/toolbox_train/"),
            ("bench", "/docs/bench/"), ("torch.autograd", "/torch/autograd/"), ("torch.nn", "/torch/nn/"),
            ("torch.utils.data", "/torch/utils/data/"), ("torch", "/torch/"), ("python", "/lib/python3"))


def package(frame: str) -> str:
    """`func (path:line)` -> its package (PACKAGES), or "other"."""
    path = frame.rsplit(" (", 1)[-1]
    for name, part in PACKAGES:
        if part in path:
            return name
    return "other"


def short(frame: str) -> str:
    """`func (/.../site-packages/pkg/file.py:12)` -> `pkg/file.py:12 func`."""
    name, _, loc = frame.rpartition(" (")
    return f"{loc.rstrip(')').split('site-packages/')[-1].split('entrypoints/')[-1]} {name}"


def summarize(raw: str, seconds: float | None = None) -> dict:
    """py-spy's raw output (`--threads`: `thread (ID): NAME;frame;...;frame COUNT` a line) -> the main thread's
    samples by innermost package, by every package on the stack, and the top innermost frames."""
    own: dict = {}
    under: dict = {}
    leaves: dict = {}
    total = 0
    for line in raw.splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        frames = stack.split(";")
        if not frames[0].endswith(": MainThread") or len(frames) < 2:
            continue
        n = int(count)
        total += n
        frames = frames[1:]
        pkg = package(frames[-1])
        own[pkg] = own.get(pkg, 0) + n
        for p in {package(f) for f in frames}:
            under[p] = under.get(p, 0) + n
        leaf = short(frames[-1])
        leaves[leaf] = leaves.get(leaf, 0) + n

    def share(d: dict) -> dict:
        return {k: round(v / total, 4) for k, v in sorted(d.items(), key=lambda kv: -kv[1])} if total else {}

    out = {"samples": total, "rate": RATE, "self": share(own), "under": share(under),
           "top": [[k, round(v / total, 4)] for k, v in sorted(leaves.items(), key=lambda kv: -kv[1])[:TOP]]}
    if seconds:
        out["coverage"] = round(total / (RATE * seconds), 3)  # samples against the window's: ~1 if none were lost
    return out


def _ptracer(who: int) -> None:
    """prctl(PR_SET_PTRACER): -1 lets any process of this user (still this user only: the kernel's uid check stays)
    read this one, as py-spy, started as a child, must under Yama's scope 1; 0 takes that back."""
    try:
        import ctypes

        ctypes.CDLL(None).prctl(0x59616D61, ctypes.c_ulong(who & 0xFFFFFFFFFFFFFFFF), 0, 0, 0)
    except (OSError, AttributeError):
        pass


class Spy:
    """py-spy on this process over a window; `summary` after stop() (or `error`)."""

    def __init__(self, raw: Path):
        self.raw, self.proc, self.summary, self.t0 = raw, None, None, None

    def start(self) -> None:
        import time

        exe = shutil.which("py-spy")
        if exe is None:
            self.summary = {"error": "py-spy not on PATH: the row ran unsampled"}
            return
        _ptracer(-1)  # Yama's ptrace_scope 1 (Ubuntu's default) lets a process read only its descendants
        self.proc = subprocess.Popen([exe, "record", "--pid", str(os.getpid()), "--nonblocking", "--threads", "--idle",
                                      "--full-filenames", "--rate", str(RATE), "--format", "raw", "--output",
                                      str(self.raw)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        self.t0 = time.perf_counter()

    def stop(self) -> None:
        import time

        if self.proc is None:
            return
        seconds = time.perf_counter() - self.t0
        self.proc.send_signal(signal.SIGINT)
        try:
            _, err = self.proc.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            err = "py-spy did not stop within 120 s"
        self.proc = None
        _ptracer(0)  # back to Yama's default once the window is sampled
        if not self.raw.is_file():
            self.summary = {"error": f"py-spy wrote nothing: {err.strip()[-300:]}"}
            return
        self.summary = {**summarize(self.raw.read_text(), seconds), "window_s": round(seconds, 3)}
