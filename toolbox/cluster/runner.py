"""Start one node command per host over SSH, stream their logs with a host prefix, and stop
all of them as soon as one fails or the user presses Ctrl-C."""

from __future__ import annotations

import os
import queue
import re
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field

from rich.console import Console
from rich.text import Text

from toolbox.cluster.hosts import Host
from toolbox.cluster import ssh as _ssh
from toolbox.cluster.ssh import SshClient, env_preamble, explain_ssh_failure

_COLORS = ("cyan", "magenta", "green", "yellow", "blue", "red", "bright_cyan", "bright_magenta")
# The remote wrapper TERMs, KILLs after its grace, then checks every process of the node is gone.
STOP_GRACE_S = _ssh.STOP_GRACE_S + 10.0
# What finetune prints on each node once its training is over, its summary written and its
# process group shut down: a node that exits non-zero after this has lost nothing.
FINISHED = re.compile(r"^finetune: node \d+ finished\b")


@dataclass
class NodeJob:
    host: Host
    rank: int
    command: list[str]
    env: dict[str, str]
    proc: subprocess.Popen | None = None
    returncode: int | None = None
    finished: bool = False  # printed FINISHED
    readers: list[threading.Thread] = field(default_factory=list)
    stderr_tail: list[str] = field(default_factory=list)


@dataclass
class Outcome:
    returncode: int
    failed: list[NodeJob]  # in the order they failed
    interrupted: bool
    stopped: list[NodeJob]  # nodes we had to stop
    late: list[NodeJob] = field(default_factory=list)  # exited non-zero after they had finished

    @property
    def usage_error(self) -> bool:
        """Every node that failed on its own exited 2: bad input (the config, a flag), refused before
        any step, which a `--resume` would meet the same way."""
        return not self.interrupted and bool(self.failed) and all(j.returncode == 2 for j in self.failed)


class Runner:
    def __init__(self, ssh: SshClient, console: Console | None = None, on_line=None):
        self.ssh = ssh
        self.on_line = on_line
        self.console = console or Console(highlight=False, soft_wrap=True)
        self._lines: queue.Queue = queue.Queue()
        self._width = 0

    def _reader(self, job: NodeJob, stream, is_err: bool) -> None:
        for raw in iter(stream.readline, b""):
            line = raw.decode(errors="replace").rstrip("\r\n")
            if is_err:
                job.stderr_tail = (job.stderr_tail + [line])[-40:]
            self._lines.put((job, line))
        stream.close()

    def _print(self, job: NodeJob, line: str) -> None:
        if FINISHED.match(line):
            job.finished = True
        if self.on_line is not None:
            self.on_line(job, line)
        color = _COLORS[job.rank % len(_COLORS)]
        prefix = f"[{job.host.destination}]".ljust(self._width + 2)
        self.console.print(Text.assemble((prefix + " ", color), line), markup=False, highlight=False)

    def _drain(self) -> None:
        while True:
            try:
                job, line = self._lines.get_nowait()
            except queue.Empty:
                return
            self._print(job, line)

    def run(self, jobs: list[NodeJob]) -> Outcome:
        self._width = max(len(j.host.destination) for j in jobs)
        readers = []
        for job in jobs:
            # Own session: Ctrl-C reaches only us, and we stop the nodes in order.
            job.proc = subprocess.Popen(self.ssh.wrapped(job.host, job.command), stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
            try:
                job.proc.stdin.write(env_preamble(job.env))
                job.proc.stdin.flush()
            except BrokenPipeError:
                pass
            for stream, is_err in ((job.proc.stdout, False), (job.proc.stderr, True)):
                t = threading.Thread(target=self._reader, args=(job, stream, is_err), daemon=True)
                t.start()
                readers.append(t)
                job.readers.append(t)

        failed: list[NodeJob] = []
        late: list[NodeJob] = []
        stopped: list[NodeJob] = []
        interrupted = False
        stop_deadline: float | None = None
        beat_at = 0.0
        try:
            while True:
                try:
                    job, line = self._lines.get(timeout=0.1)
                    self._print(job, line)
                except queue.Empty:
                    pass
                now = time.monotonic()
                for job in jobs:
                    if job.returncode is None and job.proc.poll() is not None:
                        for t in job.readers:  # its last lines may say it had finished
                            t.join(timeout=2)
                        self._drain()
                        job.returncode = job.proc.returncode
                        if job.returncode != 0 and job not in stopped:
                            (late if job.finished else failed).append(job)
                if all(j.returncode is not None for j in jobs):
                    break
                if stop_deadline is None and now - beat_at >= _ssh.HEARTBEAT_S:
                    beat_at = now
                    for j in jobs:
                        if j.returncode is None:
                            _heartbeat(j)
                if (failed or interrupted) and stop_deadline is None:
                    stop_deadline = now + STOP_GRACE_S
                    stopped = [j for j in jobs if j.returncode is None]
                    self._stop(stopped, failed, interrupted)
                elif late and stop_deadline is None and all(j.finished for j in jobs):
                    # Every node finished; the ones still running wait in torchrun's exit barrier
                    # for an agent that will not come.
                    stop_deadline = now + STOP_GRACE_S
                    stopped = [j for j in jobs if j.returncode is None]
                    self._stop(stopped, late, interrupted, why=f"{late[0].host.destination} exited after finishing")
                if stop_deadline is not None and now > stop_deadline:
                    for j in jobs:
                        if j.returncode is None:
                            _signal(j.proc, signal.SIGKILL)
                    stop_deadline = now + 3600
        except KeyboardInterrupt:
            interrupted = True
            stopped = [j for j in jobs if j.returncode is None]
            self._stop(stopped, failed, interrupted=True)
            deadline = time.monotonic() + STOP_GRACE_S
            for j in stopped:
                try:
                    j.returncode = j.proc.wait(timeout=max(0.1, deadline - time.monotonic()))
                except (subprocess.TimeoutExpired, KeyboardInterrupt):
                    _signal(j.proc, signal.SIGKILL)
                    j.returncode = j.proc.wait()
        for t in readers:
            t.join(timeout=2)
        self._drain()
        # A node that exited non-zero only because we stopped it is not a failure of its own.
        failed = [j for j in failed if j not in stopped]
        if interrupted:
            code = 130
        elif failed:
            code = failed[0].returncode
        else:
            code = 0
        return Outcome(code, failed, interrupted, stopped, late)

    def _stop(self, jobs: list[NodeJob], failed: list[NodeJob], interrupted: bool, why: str = "") -> None:
        if jobs:
            why = why or ("interrupted" if interrupted else f"{failed[0].host.destination} failed")
            self.console.print(f"cluster: {why}; stopping {', '.join(j.host.destination for j in jobs)}",
                               markup=False, highlight=False)
        for j in jobs:
            # Closing stdin makes the remote wrapper stop its command (TERM, then KILL).
            try:
                j.proc.stdin.close()
            except OSError:
                pass


def _heartbeat(job: NodeJob) -> None:
    # The node's wrapper stops everything when it hears nothing for QUIET_S.
    try:
        job.proc.stdin.write(b"\n")
        job.proc.stdin.flush()
    except (OSError, ValueError):
        pass


def _signal(proc: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def failure_reason(job: NodeJob) -> str:
    if job.returncode == 255:
        return explain_ssh_failure(job.host, "\n".join(job.stderr_tail))
    if job.returncode is not None and job.returncode > 128:
        try:
            return f"exit code {job.returncode} (killed by {signal.Signals(job.returncode - 128).name})"
        except ValueError:
            pass
    return f"exit code {job.returncode}"
