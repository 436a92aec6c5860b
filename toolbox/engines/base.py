"""The two kinds of engine and what their implementations share.

ImageEngine (podman, Docker): builds images and runs throw-away containers of them.
ContainerEngine (toolbx, distrobox): keeps long-lived containers of an image and runs
commands in the one named; it neither builds nor looks images up.
"""

from __future__ import annotations

import os
import re
import subprocess
import tempfile
from abc import ABC, abstractmethod
from collections import deque
from pathlib import Path
from typing import Callable

from toolbox.engines.spec import BuildResult, BuildSpec, RunSpec
from toolbox.errors import Terminated, ToolError


def _stop(proc: subprocess.Popen, exc: BaseException) -> None:
    """End an engine's client because toolbox is ending: a SIGTERM is handed on (the engine
    stops what it runs) and waited for; anything else kills it. Never left running behind us."""
    import signal

    if isinstance(exc, Terminated):
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
            return
        except subprocess.TimeoutExpired:
            pass
    proc.kill()
    proc.wait()


def call(argv: list[str]) -> int:
    """subprocess.call that hands a SIGTERM of toolbox on to the engine's client (podman run
    passes it to the container) and waits for it, instead of killing the client and leaving
    the container running."""
    with subprocess.Popen(argv) as proc:
        try:
            return proc.wait()
        except BaseException as exc:
            _stop(proc, exc)
            raise


LineSink = Callable[[str], None]

# podman/buildah "[2/2] STEP 3/7: RUN ..." (stage prefix when multi-stage), Docker "Step 3/7 : ...",
# BuildKit "#12 [runtime 3/7] RUN ..."
_STEP_RE = re.compile(r"^(\[\d+/\d+\] )?(STEP|Step) \d+/\d+ ?:")
_BUILDKIT_STEP_RE = re.compile(r"^#\d+ \[[\w.-]+ +\d+/\d+\] ")
_PODMAN_ERROR_RE = re.compile(r'^Error: building at STEP "(.*)": ')
_BUILDKIT_ERROR_RE = re.compile(r"^(#\d+) ERROR\b")


class Engine(ABC):
    name = "engine"

    @abstractmethod
    def available(self) -> bool: ...

    def missing_hint(self) -> str:
        return f"install {self.name}"

    @abstractmethod
    def run_command(self, spec: RunSpec) -> list[str]:
        """The command `run` executes (or its CLI equivalent), for --dry-run."""

    @abstractmethod
    def run(self, spec: RunSpec) -> int: ...


class ImageEngine(Engine):
    @abstractmethod
    def build_commands(self, spec: BuildSpec) -> list[list[str]]: ...

    @abstractmethod
    def build(self, spec: BuildSpec, sink: LineSink) -> BuildResult: ...

    @abstractmethod
    def image_info(self, ref: str) -> dict | None:
        """{'id', 'size', 'labels', 'layers'} or None when the image is missing."""

    def built(self, iid: str, tag: str, log: list[str]) -> BuildResult:
        """The result of a build tagged TAG, as the engine now reports the image."""
        info = self.image_info(tag) or {}
        return BuildResult(image_id=iid.removeprefix("sha256:"), tag=tag, size=int(info.get("size", 0)),
                           labels=info.get("labels", {}), log=log)


# The image's environment for shells that start from the host's (toolbx, distrobox): PATH with
# /opt/venv/bin first, ROCm's variables (dockerfiles/scripts/profile.sh.j2). Sourced before CMD,
# so `python` is the image's even where the host's PATH puts e.g. a pyenv shim first.
IMAGE_PROFILE = "/etc/profile.d/toolbox-image.sh"  # not toolbox.sh: toolbx mounts its own over that
_SOURCE_PROFILE = f"test -r {IMAGE_PROFILE} && . {IMAGE_PROFILE};"


class ContainerEngine(Engine):
    """Runs CMD in the existing container `spec.name`, made by `create_commands`."""

    @staticmethod
    def in_image_env(argv: list[str]) -> list[str]:
        """`sh -c ... sh ARGV`: ARGV run exactly, with the image's profile sourced first."""
        return ["sh", "-c", _SOURCE_PROFILE + 'exec "$@"', "sh", *argv]

    @staticmethod
    def in_image_env_encoded(argv: list[str]) -> list[str]:
        """As in_image_env, for a tool that re-parses its arguments through the shell
        (distrobox-enter 1.4 evals them: parentheses, runs of spaces, newlines and quotes in
        arguments break). ARGV travels base64-encoded, one argument of [A-Za-z0-9+/=], and a
        script free of quotes, globs and double spaces decodes it; with globbing off and IFS
        empty the decoded, shell-quoted line reaches eval as it was written."""
        import base64
        import shlex

        line = "exec " + shlex.join(argv)
        script = _SOURCE_PROFILE + "set -f;IFS=;eval $(printf %s $1|base64 -d)"
        return ["sh", "-c", script, "sh", base64.b64encode(line.encode()).decode()]

    @abstractmethod
    def create_commands(self, name: str, image: str, spec: RunSpec) -> list[list[str]]: ...

    def check_user(self) -> None:
        """Raise UserError when the tool refuses the calling user."""

    def container_labels(self, name: str) -> dict | None:
        """Labels of the container NAME (its image's, plus the tool's own); None when there is
        none. Both tools keep their containers in the calling user's podman."""
        try:
            cp = subprocess.run(["podman", "container", "inspect", "--format", "{{json .Config.Labels}}", name],
                                capture_output=True, text=True)
        except OSError as exc:
            raise ToolError(f"cannot start podman to look up container {name}: {exc}") from exc
        if cp.returncode != 0:
            return None
        import json

        return json.loads(cp.stdout or "null") or {}


def stream_build(label: str, argv: list[str], iidfile: str, sink: LineSink, env: dict | None = None,
                 hint: str = "") -> tuple[str, list[str]]:
    """Run a CLI build writing its image id to IIDFILE, every output line to SINK.
    Returns (image id, last lines); raises build_failure() when it fails."""
    log: deque[str] = deque(maxlen=400)
    try:
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                bufsize=1, env=env)
    except OSError as exc:
        raise ToolError(f"cannot start {argv[0]}: {exc}. {hint}".rstrip(". ")) from exc
    assert proc.stdout is not None
    try:
        for line in proc.stdout:
            line = line.rstrip("\n")
            log.append(line)
            sink(line)
        rc = proc.wait()
    except BaseException as exc:  # Ctrl-C, SIGTERM (errors.Terminated), a sink that failed
        _stop(proc, exc)
        raise
    iid = Path(iidfile).read_text().strip() if os.path.exists(iidfile) else ""
    if rc != 0 or not iid:
        raise build_failure(label, list(log), f"`{label} build` exited {rc}")
    return iid, list(log)


def iid_tempdir():
    return tempfile.TemporaryDirectory(prefix="toolbox-iid-")


def failed_step(log: list[str]) -> str | None:
    """The step that failed: 'STEP n/m: ...' (podman/buildah), 'Step n/m : ...' (Docker),
    '#N [stage n/m] ...' (BuildKit). Stages build in parallel, so the last step line printed may
    be another stage's: the engine's own error line names the failing one where it has one
    (podman `Error: building at STEP "..."`, BuildKit `#N ERROR: ...`); else the last step line."""
    lines = [line.strip() for line in log]
    steps = [s for s in lines if _STEP_RE.match(s) or _BUILDKIT_STEP_RE.match(s)]
    pick = None
    for s in reversed(lines):
        m = _PODMAN_ERROR_RE.match(s)
        if m:
            want = " ".join(m.group(1).split())
            pick = next((t for t in reversed(steps) if " ".join(_STEP_RE.sub("", t).split()) == want), None)
            break
        m = _BUILDKIT_ERROR_RE.match(s)
        if m:
            pick = next((t for t in steps if t.startswith(m.group(1) + " [")), None)
            break
    pick = " ".join((pick or (steps[-1] if steps else "")).split())  # RUN's continuation indents
    return None if not pick else pick if len(pick) <= 240 else pick[:237] + "..."


def build_failure(engine: str, log: list[str], detail: str) -> ToolError:
    step = failed_step(log)
    # The message is shown as one line (toolbox.cli.one_line cuts it at 2000 characters): the step,
    # the hint and "no image was tagged" come first, then as many of the engine's last lines as fit.
    tail: list[str] = []
    for line in reversed(log[-15:]):
        line = line.strip()
        line = line if len(line) <= 160 else line[:157] + "..."
        if sum(len(t) + 2 for t in tail) + len(line) > 1100:
            break
        tail.insert(0, "    " + line)
    hint = (
        "what to try: read the step's output above; for pip/apt TLS errors pass --ca-bundle FILE; "
        "for missing wheels on an air-gapped host pass --wheelhouse DIR; for network errors try "
        "--network host; to rule out a stale cache add --no-cache"
    )
    where = f" at {step}" if step else ""
    return ToolError(f"{engine} build failed{where}: {detail}\n  no image was tagged\n  {hint}\n  last lines:\n"
                     + "\n".join(tail))
