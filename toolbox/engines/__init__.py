"""Container engines: podman (CLI), Docker (the Docker SDK), toolbx and distrobox.

The engine layer only turns a BuildSpec/RunSpec into engine commands or API calls
and runs them; what a stack needs (devices, groups, mounts) is decided by the
commands in toolbox/commands/. `get_engine(None)` prefers podman where present.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from toolbox.errors import ToolError, UserError

ENGINE_NAMES = ("podman", "docker", "toolbx", "distrobox")
IMAGE_ENGINES = ("podman", "docker")


@dataclass
class BuildSpec:
    context: Path
    tag: str
    dockerfile: str = "Dockerfile"
    target: str | None = None
    no_cache: bool = False
    network: str | None = None
    # secret id -> host file; reaches RUN --mount=type=secret only, never a layer
    secrets: dict[str, Path] = field(default_factory=dict)
    build_args: dict[str, str] = field(default_factory=dict)

    def cli_args(self, iidfile: str) -> list[str]:
        """The `build` options podman and the docker CLI share, ending with the context."""
        argv = ["-f", str(Path(self.context) / self.dockerfile), "--iidfile", iidfile]
        if self.target:
            argv += ["--target", self.target]
        if self.no_cache:
            argv.append("--no-cache")
        if self.network:
            argv += ["--network", self.network]
        for sid, src in sorted(self.secrets.items()):
            argv += ["--secret", f"id={sid},src={src}"]
        for k, v in sorted(self.build_args.items()):
            argv += ["--build-arg", f"{k}={v}"]
        argv.append(str(self.context))
        return argv


@dataclass
class BuildResult:
    image_id: str
    tag: str
    size: int
    labels: dict[str, str]
    log: list[str]


@dataclass
class Mount:
    source: str
    target: str
    mode: str = "rw"  # rw | ro

    def spec(self) -> str:
        return f"{self.source}:{self.target}" + (":ro" if self.mode == "ro" else "")


@dataclass
class RunSpec:
    image: str
    command: list[str]
    name: str | None = None
    devices: list[str] = field(default_factory=list)
    groups: list[str] = field(default_factory=list)
    security_opts: list[str] = field(default_factory=list)
    ulimits: dict[str, str] = field(default_factory=dict)  # name -> "soft:hard"
    ipc_host: bool = False
    network: str | None = None
    mounts: list[Mount] = field(default_factory=list)
    env_names: list[str] = field(default_factory=list)  # passed by name: value stays off argv
    env: dict[str, str] = field(default_factory=dict)  # non-secret values
    workdir: str | None = None
    user: str | None = None  # "uid:gid"
    keep_id: bool = False  # podman --userns=keep-id (rootless only)
    gpus: str | None = None  # "all" for CUDA stacks
    tty: bool = False
    remove: bool = True


# podman/buildah "[2/2] STEP 3/7: RUN ..." (stage prefix when multi-stage), Docker "Step 3/7 : ..."
_STEP_RE = re.compile(r"^(\[\d+/\d+\] )?(STEP|Step) \d+/\d+ ?:")

LineSink = Callable[[str], None]


class Engine:
    """What every engine offers; image engines implement all, toolbx/distrobox a part."""

    name = "engine"

    def available(self) -> bool:
        raise NotImplementedError

    def missing_hint(self) -> str:
        return f"install {self.name}"

    # images
    def build_commands(self, spec: BuildSpec) -> list[list[str]]:
        raise UserError(f"--engine {self.name} cannot build images; use --engine podman or docker")

    def build(self, spec: BuildSpec, sink: LineSink) -> BuildResult:
        raise UserError(f"--engine {self.name} cannot build images; use --engine podman or docker")

    def image_info(self, ref: str) -> dict | None:
        """{'id', 'size', 'labels', 'layers'} or None when the image is missing."""
        raise NotImplementedError

    # containers
    def run_command(self, spec: RunSpec) -> list[str]:
        raise NotImplementedError

    def run(self, spec: RunSpec) -> int:
        raise NotImplementedError

    def create_commands(self, name: str, image: str, spec: RunSpec) -> list[list[str]]:
        raise UserError(
            f"--via {self.name} is not a long-lived container engine; use --via toolbx or distrobox"
        )


def quote(argv: list[str]) -> str:
    return shlex.join(argv)


def env_names_present(names: list[str]) -> list[str]:
    return [n for n in names if n in os.environ]


def which(name: str) -> str | None:
    return shutil.which(name)


def get_engine(name: str | None) -> Engine:
    """The named engine, or podman if installed, else Docker (SDK); UserError if none."""
    from toolbox.engines.distrobox import DistroboxEngine
    from toolbox.engines.docker import DockerEngine
    from toolbox.engines.podman import PodmanEngine
    from toolbox.engines.toolbx import ToolbxEngine

    classes = {
        "podman": PodmanEngine,
        "docker": DockerEngine,
        "toolbx": ToolbxEngine,
        "distrobox": DistroboxEngine,
    }
    if name is not None:
        if name not in classes:
            raise UserError(f"--engine: unknown engine {name!r}; choose one of {', '.join(ENGINE_NAMES)}")
        return classes[name]()
    podman = PodmanEngine()
    if podman.available():
        return podman
    docker = DockerEngine()
    if docker.available():
        return docker
    raise ToolError(
        "no container engine found: neither `podman` on PATH nor a Docker API socket "
        "(DOCKER_HOST or /var/run/docker.sock). Install podman (`apt-get install podman` / "
        "`dnf install podman`) or start Docker, or pass --engine."
    )


def require(engine: Engine) -> Engine:
    if not engine.available():
        raise ToolError(f"{engine.name} is not available: {engine.missing_hint()}")
    return engine


def failed_step(log: list[str]) -> str | None:
    """The last 'STEP n/m: ...' (podman/buildah) or 'Step n/m : ...' (Docker) line."""
    for line in reversed(log):
        s = line.strip()
        if _STEP_RE.match(s):
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
