"""distrobox: long-lived containers on (rootless) podman or Docker; engine flags via --additional-flags."""

from __future__ import annotations

import os
import shlex
import shutil

from toolbox.engines.base import ContainerEngine, call
from toolbox.engines.spec import RunSpec
from toolbox.errors import ToolError, UserError


class DistroboxEngine(ContainerEngine):
    name = "distrobox"

    def available(self) -> bool:
        return shutil.which("distrobox") is not None

    def missing_hint(self) -> str:
        return "`distrobox` is not on PATH (`apt-get install distrobox`, `dnf install distrobox`)"

    def check_user(self) -> None:
        if os.geteuid() == 0:
            raise UserError(
                "distrobox refuses to run as root (it drives rootless podman); run `toolbox create/run "
                "--engine distrobox` as your normal user, or use `--engine podman` as root"
            )

    def create_commands(self, name: str, image: str, spec: RunSpec) -> list[list[str]]:
        argv = ["distrobox", "create", "--yes", "--name", name, "--image", image]
        flags = spec.device_flags("podman")
        if flags:
            # distrobox splices this string into its podman/docker create command
            argv += ["--additional-flags", shlex.join(flags)]
        return [argv]

    def run_command(self, spec: RunSpec) -> list[str]:
        if not spec.name:
            raise ToolError("--engine distrobox runs CMD in an existing container: pass --name C")
        return ["distrobox", "enter", "--name", spec.name, "--", *self.in_image_env_encoded(spec.command)]

    def run(self, spec: RunSpec) -> int:
        self.check_user()
        return call(self.run_command(spec))
