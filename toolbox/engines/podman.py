"""podman through its CLI."""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from collections import deque
from pathlib import Path

from toolbox.engines import BuildResult, BuildSpec, Engine, LineSink, RunSpec, build_failure, which
from toolbox.errors import ToolError


class PodmanEngine(Engine):
    name = "podman"

    def __init__(self, binary: str | None = None):
        self.binary = binary or os.environ.get("TOOLBOX_PODMAN", "podman")

    def available(self) -> bool:
        return which(self.binary) is not None

    def missing_hint(self) -> str:
        return "`podman` is not on PATH; install it (`apt-get install podman`, `dnf install podman`)"

    # -- build --------------------------------------------------------------
    def _build_argv(self, spec: BuildSpec, iidfile: str) -> list[str]:
        # Docker format: OCI images drop SHELL (the Dockerfile's pipefail) and HEALTHCHECK, and
        # it is what podman's Docker API builds, so both paths share one layer cache.
        return [self.binary, "build", "--format", "docker", "--layers", *spec.cli_args(iidfile)]

    def build_commands(self, spec: BuildSpec) -> list[list[str]]:
        # built untagged into an iid file, tagged only once the build succeeded
        iid = "$IIDFILE"
        return [self._build_argv(spec, iid), [self.binary, "tag", "$(cat $IIDFILE)", spec.tag]]

    def build(self, spec: BuildSpec, sink: LineSink) -> BuildResult:
        with tempfile.TemporaryDirectory(prefix="toolbox-iid-") as tmp:
            iidfile = os.path.join(tmp, "iid")
            argv = self._build_argv(spec, iidfile)
            log: deque[str] = deque(maxlen=400)
            try:
                proc = subprocess.Popen(
                    argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1
                )
            except OSError as exc:
                raise ToolError(f"cannot start {self.binary}: {exc}. {self.missing_hint()}") from exc
            assert proc.stdout is not None
            for line in proc.stdout:
                line = line.rstrip("\n")
                log.append(line)
                sink(line)
            rc = proc.wait()
            iid = Path(iidfile).read_text().strip() if os.path.exists(iidfile) else ""
            if rc != 0 or not iid:
                raise build_failure("podman", list(log), f"`podman build` exited {rc}")
        self._cli("tag", iid, spec.tag)
        info = self.image_info(spec.tag) or {}
        return BuildResult(
            image_id=iid.removeprefix("sha256:"),
            tag=spec.tag,
            size=int(info.get("size", 0)),
            labels=info.get("labels", {}),
            log=list(log),
        )

    def _cli(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        try:
            cp = subprocess.run([self.binary, *args], capture_output=True, text=True)
        except OSError as exc:
            raise ToolError(f"cannot start {self.binary}: {exc}. {self.missing_hint()}") from exc
        if check and cp.returncode != 0:
            raise ToolError(f"`podman {' '.join(args)}` failed: {cp.stderr.strip()[-2000:]}")
        return cp

    def image_info(self, ref: str) -> dict | None:
        cp = self._cli("image", "inspect", ref, check=False)
        if cp.returncode != 0:
            if "image not known" in cp.stderr or "no such image" in cp.stderr.lower():
                return None
            raise ToolError(f"`podman image inspect {ref}` failed: {cp.stderr.strip()}")
        data = json.loads(cp.stdout)[0]
        return {
            "id": data["Id"],
            "size": data.get("Size", 0),
            "labels": data.get("Labels") or (data.get("Config") or {}).get("Labels") or {},
            "layers": (data.get("RootFS") or {}).get("Layers") or [],
        }

    # -- run ----------------------------------------------------------------
    def run_command(self, spec: RunSpec) -> list[str]:
        argv = [self.binary, "run"]
        if spec.remove:
            argv.append("--rm")
        argv.append("-it" if spec.tty else "-i")
        if spec.name:
            argv += ["--name", spec.name]
        if spec.ipc_host:
            argv.append("--ipc=host")
        if spec.network:
            argv.append(f"--network={spec.network}")
        for opt in spec.security_opts:
            argv += ["--security-opt", opt]
        for dev in spec.devices:
            argv += ["--device", dev]
        if spec.gpus:
            # CDI, as nvidia-ctk generates it for podman
            argv += ["--device", f"nvidia.com/gpu={spec.gpus}"]
        for grp in spec.groups:
            argv += ["--group-add", grp]
        for name, val in sorted(spec.ulimits.items()):
            argv += ["--ulimit", f"{name}={val}"]
        if spec.keep_id:
            argv.append("--userns=keep-id")
        if spec.user:
            argv += ["--user", spec.user]
        for m in spec.mounts:
            argv += ["-v", m.spec()]
        for k, v in sorted(spec.env.items()):
            argv += ["-e", f"{k}={v}"]
        for n in spec.env_names:
            argv += ["-e", n]  # by name: podman reads the value from its own environment
        if spec.workdir:
            argv += ["-w", spec.workdir]
        argv.append(spec.image)
        argv += spec.command
        return argv

    def run(self, spec: RunSpec) -> int:
        argv = self.run_command(spec)
        try:
            return subprocess.call(argv)
        except OSError as exc:
            raise ToolError(f"cannot start {self.binary}: {exc}. {self.missing_hint()}") from exc
