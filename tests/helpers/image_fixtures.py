"""Session fixtures for every test folder (tests/conftest.py imports them): the base image,
the cpu stack's image built ONCE per session with podman, and the engines that share it
without a rebuild where a build is not the point: podman's Docker API socket, a real dockerd,
and an unprivileged user's rootless podman (distrobox, toolbx).

Machine set-up for those (dockerd's flags, the user, the D-Bus file) lives here and in
enginekit.py, not in the product.
"""

from __future__ import annotations

import os
import socket
import subprocess
import time
from pathlib import Path

import pytest

from helpers.enginekit import Dockerd, TestUser, need
from helpers.prebuilt import build_cpu_image, ensure_base_image, seed_buildkit_caches


def _wait_for_socket(sock: Path, proc: subprocess.Popen, what: str, log: Path, seconds: int = 60) -> None:
    deadline = time.time() + seconds
    while time.time() < deadline:
        if sock.exists():
            s = socket.socket(socket.AF_UNIX)
            try:
                s.connect(str(sock))
                return
            except OSError:
                pass
            finally:
                s.close()
        if proc.poll() is not None:
            pytest.fail(f"{what} exited {proc.returncode}: {log.read_text()[-3000:]}")
        time.sleep(0.2)
    pytest.fail(f"{what} did not open {sock} in {seconds} s: {log.read_text()[-3000:]}")


@pytest.fixture(scope="session")
def base_image() -> str:
    return ensure_base_image()


@pytest.fixture(scope="session")
def podman_socket(tmp_path_factory):
    """`podman system service` on a unix socket of our own; yields its DOCKER_HOST URL."""
    need("podman")
    sock = tmp_path_factory.mktemp("podman-api") / "podman.sock"
    url = f"unix://{sock}"
    logf = sock.parent / "service.log"
    log = open(logf, "w")
    proc = subprocess.Popen(["podman", "system", "service", "--time=0", url], stdout=log, stderr=subprocess.STDOUT)
    try:
        _wait_for_socket(sock, proc, "podman system service", logf, 30)
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
    return build_cpu_image()


@pytest.fixture(scope="session")
def dockerd(base_image, tmp_path_factory):
    """A real Docker daemon (Debian's docker.io) of our own, off the host's network set-up, with
    the podman-made base image loaded (`podman save | docker load`) and podman's build caches
    (ccache, pip) copied into its BuildKit cache mounts; stopped and its leftovers (netns mounts,
    /etc/docker, /run/docker, /run/containerd) removed at the end."""
    need("dockerd")
    if os.geteuid() != 0:
        pytest.skip("dockerd needs root")
    d = Dockerd(Path(tmp_path_factory.mktemp("dockerd")))
    logf = d.root / "dockerd.log"
    log = open(logf, "w")
    proc = subprocess.Popen(d.argv(), stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        _wait_for_socket(d.sock, proc, "dockerd", logf, 60)
        save = subprocess.Popen(["podman", "save", base_image], stdout=subprocess.PIPE)
        load = subprocess.run(d.cli("load"), stdin=save.stdout, capture_output=True, text=True)
        save.stdout.close()
        if save.wait() != 0 or load.returncode != 0:
            pytest.fail(f"podman save | docker load failed: {load.stderr}")
        # llama.cpp compiled once per run: podman's build filled a ccache that this daemon's
        # BuildKit build of the same Dockerfile uses (the build itself stays a whole BuildKit build)
        print(seed_buildkit_caches(d.cli(), base_image, d.root))
        yield d
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
        d.clean_up()


@pytest.fixture(scope="session")
def test_user(cpu_image):
    """An unprivileged user (useradd: subuids) with rootless podman - host network, overlay
    storage - and the session's cpu image loaded into its storage (`podman save | podman load`,
    no rebuild); for distrobox (which refuses root) and toolbx. Removed with its storage at the
    end (TOOLBOX_TEST_KEEP_USER=1 keeps it for the next run)."""
    for tool in ("podman", "runuser", "useradd", "newuidmap"):
        need(tool)
    if os.geteuid() != 0:
        pytest.skip("making a test user needs root")
    user = TestUser.make("toolbox-ci")
    try:
        user.load_image(cpu_image["tag"])
        yield user
    finally:
        if os.environ.get("TOOLBOX_TEST_KEEP_USER") != "1":
            user.remove()
