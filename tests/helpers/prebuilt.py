"""The suite's slow shared inputs, each made once and reused by every test folder that needs it:
the base image (debootstrap + podman import), the cpu stack's image (`toolbox build`, podman), the
Ray test image on top of it, and BuildKit's ccache and pip cache seeded from podman's (a test
dockerd starts empty: without the seed its BuildKit build compiled llama.cpp from nothing again).

tests/prebuild.py makes them before pytest runs (`make test`, .ci/run: each step timed); the
session fixtures (image_fixtures.py) call the same functions, which find the work done.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from helpers.enginekit import BASE_REF, CACHE, ca_bundle, need, podman, toolbox, wheelhouse

RAY = "ray[train]==2.60.0"
# A cold cpu build compiles llama.cpp: 25-30 min on 2 shared cores (2026-12-07); 30 min cut one short
BUILD_TIMEOUT = 5400
# where podman (buildah) keeps RUN --mount=type=cache folders (TMPDIR, default /var/tmp; the folder
# is buildah-cache, or buildah-cache-UID in newer buildah), each at its target path
BUILDAH_CACHES = ("buildah-cache", f"buildah-cache-{os.getuid()}")
CCACHE_TARGET = "/root/.ccache"  # the llama.cpp builder stage's cache mount (dockerfiles/stages/llama_cpp.j2)
SEEDED = (CCACHE_TARGET, "/root/.cache/pip")  # and the pip steps' (dockerfiles/runtime/*.j2)


def ensure_base_image() -> str:
    """The cpu stack's FROM (docker.io/library/debian:bookworm-slim), made here: no registry answers
    in CI. The rootfs tarball stays in the test cache, the image in podman's store."""
    need("podman")
    if podman("image", "exists", BASE_REF, check=False).returncode == 0:
        return BASE_REF
    need("debootstrap")
    CACHE.mkdir(parents=True, exist_ok=True)
    tarball = CACHE / "bookworm-minbase.tar"
    if not tarball.exists():
        rootfs = CACHE / f"bookworm-rootfs-{os.getpid()}"
        shutil.rmtree(rootfs, ignore_errors=True)
        subprocess.run(
            ["debootstrap", "--variant=minbase", "bookworm", str(rootfs), "http://deb.debian.org/debian"],
            check=True, capture_output=True, text=True, timeout=1200,
        )
        tmp = tarball.with_suffix(f".{os.getpid()}.tmp")
        subprocess.run(["tar", "-C", str(rootfs), "-cf", str(tmp), "."], check=True)
        tmp.rename(tarball)
        shutil.rmtree(rootfs, ignore_errors=True)
    podman("import", str(tarball), BASE_REF)
    return BASE_REF


def build_cpu_image() -> dict:
    """`toolbox build --stack cpu` with podman: its tag and the build's output. Cold, the one full
    build of the run; after that (tests/prebuild.py made it) every step comes from podman's cache."""
    ensure_base_image()
    cp = toolbox(
        "build", "--stack", "cpu", "--engine", "podman",
        "--ca-bundle", str(ca_bundle()), "--wheelhouse", str(wheelhouse()),
        check=True, timeout=BUILD_TIMEOUT,
    )
    tag = next(line.split(None, 1)[1].strip() for line in cp.stdout.splitlines() if line.startswith("image:"))
    return {"tag": tag, "stdout": cp.stdout}


def ensure_ray_image(cpu_tag: str) -> str:
    """The cpu image plus ray[train], from wheels fetched on this host (kept in the test cache)."""
    tag = "localhost/toolbox-test-ray:" + cpu_tag.rsplit(":", 1)[-1]
    if podman("image", "exists", tag, check=False).returncode == 0:
        return tag
    wheels = CACHE / "ray-wheels"
    if not any(wheels.glob("ray-2.60.0-*.whl")):
        wheels.mkdir(parents=True, exist_ok=True)
        # The image's Python is Debian bookworm's 3.11, as this host's test venv (cp311 wheels).
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--only-binary=:all:", "-d", str(wheels), RAY],
                       check=True, timeout=900)
    ctx = CACHE / f"ray-image-context-{os.getpid()}"
    shutil.rmtree(ctx, ignore_errors=True)
    shutil.copytree(wheels, ctx / "wheels")
    (ctx / "Containerfile").write_text(
        f"FROM {cpu_tag}\nCOPY wheels /tmp/wheels\n"
        f"RUN /opt/venv/bin/python -m pip install -q --no-index --find-links /tmp/wheels '{RAY}' && rm -rf /tmp/wheels"
        " && ln -sf /opt/venv/bin/ray /usr/local/bin/ray\n")
    r = podman("build", "-q", "-t", tag, str(ctx), check=False)
    shutil.rmtree(ctx, ignore_errors=True)
    if r.returncode != 0:
        raise AssertionError(f"podman build of {tag} failed:\n{r.stderr[-3000:]}")
    return tag


def podman_cache(target: str) -> Path | None:
    """The folder podman's builds filled for the cache mount at `target` (None before the first)."""
    tmp = os.environ.get("TMPDIR") or "/var/tmp"
    for name in BUILDAH_CACHES:
        d = Path(tmp) / name / target.lstrip("/")
        if d.is_dir() and any(d.iterdir()):
            return d
    return None


def podman_ccache() -> Path | None:
    return podman_cache(CCACHE_TARGET)


def seed_buildkit_caches(cli: list[str], base: str, work: Path) -> str:
    """Copy podman's ccache and pip cache into the BuildKit cache mounts at the same targets, on the
    daemon `cli` talks to, with a BuildKit build of its own (a cache mount is shared by every build
    of a daemon that names the same target). The stack's BuildKit build then compiles llama.cpp from
    those objects (same Dockerfile, base, compiler and paths as podman's build) and downloads no
    wheel again. What it did, in one line."""
    found = {t: podman_cache(t) for t in SEEDED}
    found = {t: d for t, d in found.items() if d is not None}
    if not found:
        return "no podman build caches to seed BuildKit's from (the cpu image was not built first)"
    ctx = work / "cache-seed"
    shutil.rmtree(ctx, ignore_errors=True)
    ctx.mkdir(parents=True)
    mounts, copies = [], []
    for i, (target, src) in enumerate(sorted(found.items())):
        subprocess.run(["cp", "-a", "--reflink=auto", str(src), str(ctx / f"c{i}")], check=True)
        mounts += [f"--mount=type=cache,target={target}", f"--mount=type=bind,source=c{i},target=/seed/c{i}"]
        copies.append(f"cp -a /seed/c{i}/. {target}/")
    (ctx / "Dockerfile").write_text(f"FROM {base}\nRUN {' '.join(mounts)} {' && '.join(copies)}\n")
    cp = subprocess.run([*cli, "build", "--network", "host", "-q", str(ctx)], capture_output=True, text=True,
                        env={**os.environ, "DOCKER_BUILDKIT": "1"}, timeout=1200)
    shutil.rmtree(ctx, ignore_errors=True)
    if cp.returncode != 0:
        raise AssertionError(f"seeding BuildKit's caches failed:\n{cp.stdout[-2000:]}\n{cp.stderr[-2000:]}")
    return "BuildKit's cache mounts seeded from podman's: " + ", ".join(f"{t} <- {d}" for t, d in sorted(found.items()))
