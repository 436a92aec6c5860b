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
from toolbox.errors import ToolError

LineSink = Callable[[str], None]

# podman/buildah "[2/2] STEP 3/7: RUN ..." (stage prefix when multi-stage), Docker "Step 3/7 : ...",
# BuildKit "#12 [runtime 3/7] RUN ..."
_STEP_RE = re.compile(r"^(\[\d+/\d+\] )?(STEP|Step) \d+/\d+ ?:")
_BUILDKIT_STEP_RE = re.compile(r"^#\d+ \[[\w.-]+ +\d+/\d+\] ")


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


class ContainerEngine(Engine):
    """Runs CMD in the existing container `spec.name`, made by `create_commands`."""

    @abstractmethod
    def create_commands(self, name: str, image: str, spec: RunSpec) -> list[list[str]]: ...

    def check_user(self) -> None:
        """Raise UserError when the tool refuses the calling user."""


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
    for line in proc.stdout:
        line = line.rstrip("\n")
        log.append(line)
        sink(line)
    rc = proc.wait()
    iid = Path(iidfile).read_text().strip() if os.path.exists(iidfile) else ""
    if rc != 0 or not iid:
        raise build_failure(label, list(log), f"`{label} build` exited {rc}")
    return iid, list(log)


def iid_tempdir():
    return tempfile.TemporaryDirectory(prefix="toolbox-iid-")


def failed_step(log: list[str]) -> str | None:
    """The last step line: 'STEP n/m: ...' (podman/buildah), 'Step n/m : ...' (Docker),
    '#N [stage n/m] ...' (BuildKit)."""
    for line in reversed(log):
        s = line.strip()
        if _STEP_RE.match(s) or _BUILDKIT_STEP_RE.match(s):
            return s if len(s) <= 240 else s[:237] + "..."
    return None


def build_failure(engine: str, log: list[str], detail: str) -> ToolError:
    step = failed_step(log)
    tail = "\n".join("    " + line for line in log[-15:])
    hint = (
        "what to try: read the step's output above; for pip/apt TLS errors pass --ca-bundle FILE; "
        "for missing wheels on an air-gapped host pass --wheelhouse DIR; for network errors try "
        "--network host; to rule out a stale cache add --no-cache"
    )
    where = f" at {step}" if step else ""
    return ToolError(f"{engine} build failed{where}: {detail}\n  last lines:\n{tail}\n  {hint}\n  no image was tagged")
