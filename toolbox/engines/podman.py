"""podman through its CLI."""

from __future__ import annotations

import json
import os
import shutil
import subprocess

from toolbox.engines.base import ImageEngine, LineSink, call, iid_tempdir, stream_build
from toolbox.engines.spec import BuildResult, BuildSpec, RunSpec
from toolbox.errors import ToolError


class PodmanEngine(ImageEngine):
    name = "podman"

    def __init__(self, binary: str | None = None):
        self.binary = binary or os.environ.get("TOOLBOX_PODMAN", "podman")
        self._why: str | None = ""  # "" = not asked yet; None = answers

    def why_not(self) -> str | None:
        """None when podman answers (`podman info` exits 0), else why not; asked once.
        A binary on PATH is not enough: a podman that cannot reach its storage or runtime
        fails every build, and `.ci/setup engine` must not count it (engines.answering)."""
        if self._why == "":
            if shutil.which(self.binary) is None:
                self._why = f"`{self.binary}` is not on PATH"
            else:
                try:
                    cp = subprocess.run([self.binary, "info", "--format", "{{.Host.OCIRuntime.Name}}"],
                                        capture_output=True, text=True, timeout=120)
                    last = (cp.stderr.strip().splitlines() or [""])[-1]
                    self._why = None if cp.returncode == 0 else f"`{self.binary} info` exited {cp.returncode}: {last}"
                except (OSError, subprocess.TimeoutExpired) as exc:
                    self._why = f"`{self.binary} info` did not answer: {exc}"
        return self._why

    def available(self) -> bool:
        return self.why_not() is None

    def missing_hint(self) -> str:
        why = self.why_not()
        if why is None or "not on PATH" in why:
            return "`podman` is not on PATH; install it (`apt-get install podman`, `dnf install podman`)"
        return f"{why}; `podman info` must work before podman can build"

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
        with iid_tempdir() as tmp:
            iidfile = os.path.join(tmp, "iid")
            iid, log = stream_build("podman", self._build_argv(spec, iidfile), iidfile, sink,
                                    hint=self.missing_hint())
        self._cli("tag", iid, spec.tag)
        return self.built(iid, spec.tag, log)

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
        return spec.run_argv([self.binary, "run"], "podman")

    def run(self, spec: RunSpec) -> int:
        argv = self.run_command(spec)
        try:
            return call(argv)
        except OSError as exc:
            raise ToolError(f"cannot start {self.binary}: {exc}. {self.missing_hint()}") from exc
