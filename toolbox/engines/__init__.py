"""Container engines: podman (CLI) and Docker (the Docker SDK) build images and run them;
toolbx and distrobox keep long-lived containers (base.py: ImageEngine, ContainerEngine).

The engine layer only turns a BuildSpec/RunSpec (spec.py) into engine commands or API calls
and runs them; what a stack needs (devices, groups, mounts) is decided in run_options.py.
`get_engine(None)` prefers podman where present.
"""

from __future__ import annotations

import shlex

from toolbox.engines.base import (ContainerEngine, Engine, ImageEngine, LineSink, build_failure,  # noqa: F401
                                  failed_step)
from toolbox.engines.spec import BuildResult, BuildSpec, Mount, RunSpec  # noqa: F401
from toolbox.errors import ToolError, UserError

IMAGE_ENGINES = ("podman", "docker")
CONTAINER_ENGINES = ("toolbx", "distrobox")
ENGINE_NAMES = IMAGE_ENGINES + CONTAINER_ENGINES


def quote(argv: list[str]) -> str:
    return shlex.join(argv)


def _classes() -> dict[str, type]:
    from toolbox.engines.distrobox import DistroboxEngine
    from toolbox.engines.docker import DockerEngine
    from toolbox.engines.podman import PodmanEngine
    from toolbox.engines.toolbx import ToolbxEngine

    return {"podman": PodmanEngine, "docker": DockerEngine, "toolbx": ToolbxEngine, "distrobox": DistroboxEngine}


def get_engine(name: str | None) -> Engine:
    """The named engine, or podman if installed, else Docker (SDK); UserError if none."""
    classes = _classes()
    if name is not None:
        if name not in classes:
            raise UserError(f"--engine: unknown engine {name!r}; choose one of {', '.join(ENGINE_NAMES)}")
        return classes[name]()
    for default in IMAGE_ENGINES:
        engine = classes[default]()
        if engine.available():
            return engine
    raise ToolError(
        "no container engine found: neither `podman` on PATH nor a Docker API socket "
        "(DOCKER_HOST or /var/run/docker.sock). Install podman (`apt-get install podman` / "
        "`dnf install podman`) or start Docker, or pass --engine."
    )


def require(engine: Engine) -> Engine:
    if not engine.available():
        raise ToolError(f"{engine.name} is not available: {engine.missing_hint()}")
    return engine
