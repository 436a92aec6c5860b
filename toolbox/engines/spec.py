"""What the commands hand to an engine: a BuildSpec or a RunSpec, and their rendering into the
command-line flags that podman, the docker CLI and distrobox's --additional-flags share."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path


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

    def device_flags(self, dialect: str = "podman") -> list[str]:
        """Devices, GPUs, groups, security options, ulimits: what a stack needs of the host.
        dialect "podman" asks for NVIDIA GPUs through CDI (as nvidia-ctk sets it up for
        podman), "docker" through --gpus."""
        flags: list[str] = []
        for dev in self.devices:
            flags += ["--device", dev]
        if self.gpus:
            flags += ["--gpus", self.gpus] if dialect == "docker" else ["--device", f"nvidia.com/gpu={self.gpus}"]
        for grp in self.groups:
            flags += ["--group-add", grp]
        for opt in self.security_opts:
            flags += ["--security-opt", opt]
        for name, val in sorted(self.ulimits.items()):
            flags += ["--ulimit", f"{name}={val}"]
        return flags

    def run_argv(self, prefix: list[str], dialect: str = "podman") -> list[str]:
        """`PREFIX [flags] IMAGE CMD...` for `podman run` / `docker run`."""
        argv = list(prefix)
        if self.remove:
            argv.append("--rm")
        argv.append("-it" if self.tty else "-i")
        if self.name:
            argv += ["--name", self.name]
        if self.ipc_host:
            argv.append("--ipc=host")
        if self.network:
            argv.append(f"--network={self.network}")
        argv += self.device_flags(dialect)
        if self.keep_id and dialect == "podman":
            argv.append("--userns=keep-id")
        if self.user:
            argv += ["--user", self.user]
        for m in self.mounts:
            argv += ["-v", m.spec()]
        for k, v in sorted(self.env.items()):
            argv += ["-e", f"{k}={v}"]
        for n in self.env_names:
            argv += ["-e", n]  # by name: the engine reads the value from its own environment
        if self.workdir:
            argv += ["-w", self.workdir]
        argv.append(self.image)
        argv += self.command
        return argv
