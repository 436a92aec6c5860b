"""Fedora toolbx: long-lived containers that share the user's home, /dev and network.

Its binary is also called `toolbox`, like this project's CLI, so it is found by
skipping Python entry scripts on PATH (or named by TOOLBOX_TOOLBX).
"""

from __future__ import annotations

import os

from toolbox.engines.base import ContainerEngine, call
from toolbox.engines.spec import RunSpec
from toolbox.errors import ToolError


def find_toolbx() -> str | None:
    explicit = os.environ.get("TOOLBOX_TOOLBX")
    if explicit:
        return explicit
    for d in os.environ.get("PATH", "").split(os.pathsep):
        path = os.path.join(d or ".", "toolbox")
        if not (os.path.isfile(path) and os.access(path, os.X_OK)):
            continue
        try:
            with open(path, "rb") as fh:
                head = fh.read(4)
        except OSError:
            continue
        if head == b"\x7fELF":  # Fedora's toolbx is a Go binary; ours is a Python script
            return path
    return None


class ToolbxEngine(ContainerEngine):
    name = "toolbx"

    def __init__(self):
        self.binary = find_toolbx() or "toolbox"

    def available(self) -> bool:
        return find_toolbx() is not None

    def missing_hint(self) -> str:
        return "Fedora's toolbx is not installed (`dnf install toolbox`; or set TOOLBOX_TOOLBX=/path/to/it)"

    def create_commands(self, name: str, image: str, spec: RunSpec) -> list[list[str]]:
        # toolbx already runs its containers --privileged with the host's /dev mounted
        # and takes no extra engine flags: no device flags needed (or possible).
        return [[self.binary, "create", "--image", image, name]]

    def run_command(self, spec: RunSpec) -> list[str]:
        if not spec.name:
            raise ToolError("--engine toolbx runs CMD in an existing container: pass --name C")
        # toolbx forwards the caller's environment itself, so HF_TOKEN & co. need no flag
        # (its PATH is the host's: the image's profile puts /opt/venv/bin first)
        return [self.binary, "run", "--container", spec.name, *self.in_image_env(spec.command)]

    def run(self, spec: RunSpec) -> int:
        return call(self.run_command(spec))
