"""Session fixtures of the engine tests: the base image, a podman API socket, the cpu image.

The helpers (and the CONTAINERS_CONF set-up) live in enginekit.py.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time

import pytest

from enginekit import BASE_REF, CACHE, ca_bundle, need, podman, toolbox, wheelhouse


@pytest.fixture(scope="session")
def base_image() -> str:
    need("podman")
    if podman("image", "exists", BASE_REF, check=False).returncode == 0:
        return BASE_REF
    need("debootstrap")
    CACHE.mkdir(parents=True, exist_ok=True)
    tarball = CACHE / "bookworm-minbase.tar"
    if not tarball.exists():
        rootfs = CACHE / "bookworm-rootfs"
        shutil.rmtree(rootfs, ignore_errors=True)
        subprocess.run(
            ["debootstrap", "--variant=minbase", "bookworm", str(rootfs), "http://deb.debian.org/debian"],
            check=True, capture_output=True, text=True, timeout=1200,
        )
        tmp = tarball.with_suffix(".tmp")
        subprocess.run(["tar", "-C", str(rootfs), "-cf", str(tmp), "."], check=True)
        tmp.rename(tarball)
        shutil.rmtree(rootfs, ignore_errors=True)
    podman("import", str(tarball), BASE_REF)
    return BASE_REF


@pytest.fixture(scope="session")
def podman_socket(tmp_path_factory):
    """`podman system service` on a unix socket of our own; yields its DOCKER_HOST URL."""
    need("podman")
    sock = tmp_path_factory.mktemp("podman-api") / "podman.sock"
    url = f"unix://{sock}"
    log = open(sock.parent / "service.log", "w")
    proc = subprocess.Popen(["podman", "system", "service", "--time=0", url], stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.time() + 30
        while time.time() < deadline:
            if sock.exists():
                s = socket.socket(socket.AF_UNIX)
                try:
                    s.connect(str(sock))
                    break
                except OSError:
                    pass
                finally:
                    s.close()
            if proc.poll() is not None:
                pytest.fail(f"podman system service exited {proc.returncode}: {(sock.parent / 'service.log').read_text()}")
            time.sleep(0.2)
        else:
            pytest.fail("podman system service did not open its socket in 30 s")
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


@pytest.fixture(scope="session")
def cpu_image(base_image) -> dict:
    """The cpu stack built once with `toolbox build` (podman); its tag and the build output."""
    cp = toolbox(
        "build", "--stack", "cpu", "--engine", "podman",
        "--ca-bundle", str(ca_bundle()), "--wheelhouse", str(wheelhouse()),
        check=True,
    )
    tag = next(line.split(None, 1)[1].strip() for line in cp.stdout.splitlines() if line.startswith("image:"))
    return {"tag": tag, "stdout": cp.stdout}
