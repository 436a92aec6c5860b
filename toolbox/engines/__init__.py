"""Container engines: podman (CLI) and Docker (the Docker SDK) build images and run them;
toolbx and distrobox keep long-lived containers (base.py: ImageEngine, ContainerEngine).

The engine layer only turns a BuildSpec/RunSpec (spec.py) into engine commands or API calls
and runs them; what a stack needs (devices, groups, mounts) is decided in run_options.py.
`get_engine(None)` prefers podman where it answers. "An engine" means one that answers
(`podman info` exits 0; the Docker API pings), never a client binary alone: `answering` is the one
definition, and `.ci/setup engine` (make image's set-up) asks it through `setup_probe`.
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


def answering(names: tuple[str, ...] = IMAGE_ENGINES) -> tuple[Engine | None, list[str]]:
    """The first of NAMES whose engine answers, and why each one before it does not.
    A docker CLI without a daemon is no engine: Docker counts only when its API pings."""
    classes, why = _classes(), []
    for name in names:
        engine = classes[name]()
        if engine.available():
            return engine, why
        why.append(f"{name}: {engine.missing_hint()}")
    return None, why


def get_engine(name: str | None) -> Engine:
    """The named engine, or the first of podman, Docker (SDK) that answers; ToolError if none."""
    classes = _classes()
    if name is not None:
        if name not in classes:
            raise UserError(f"--engine: unknown engine {name!r}; choose one of {', '.join(ENGINE_NAMES)}")
        return classes[name]()
    engine, why = answering()
    if engine is not None:
        return engine
    raise ToolError(
        "no container engine found that answers (" + "; ".join(why) + "). Install podman "
        "(`apt-get install podman` / `dnf install podman`) or start Docker, or pass --engine."
    )


def setup_probe(argv: list[str]) -> int:
    """`.ci/setup engine`'s question, answered by the same rule as `toolbox build`: prints the
    engine that answers (ARGV[0] if given, else podman then Docker) and returns 0; else says
    why each does not on stderr and returns 1."""
    import sys

    names = tuple(argv[:1]) or IMAGE_ENGINES
    if any(n not in IMAGE_ENGINES for n in names):
        print(f"ENGINE={names[0]}: choose one of {', '.join(IMAGE_ENGINES)}", file=sys.stderr)
        return 2
    engine, why = answering(names)
    if engine is None:
        for line in why:
            print(f"setup: {line}", file=sys.stderr)
        return 1
    print(engine.name)
    return 0


def require(engine: Engine) -> Engine:
    if not engine.available():
        raise ToolError(f"{engine.name} is not available: {engine.missing_hint()}")
    return engine
