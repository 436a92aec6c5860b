"""Helpers for the engine tests: podman set up for this machine, a locally made base
image, a Docker-API socket served by podman, and the cpu stack's image built once.

No registry is reachable where CI runs, so the base image the cpu stack names in FROM
(docker.io/library/debian:bookworm-slim) is made with debootstrap and `podman import`,
once per machine (podman's store keeps it across runs, the rootfs tarball too).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
BASE_REF = "docker.io/library/debian:bookworm-slim"
CACHE = Path(os.environ.get("TOOLBOX_TEST_CACHE", "/var/tmp/toolbox-tests"))
IN_CI = os.environ.get("CI") == "true"

# Machine quirks (runc, cgroupfs, rlimits) for every podman this test process starts.
os.environ.setdefault("CONTAINERS_CONF", str(HERE / "containers.conf"))


def need(tool: str) -> None:
    if shutil.which(tool) is None:
        msg = f"{tool} is not installed (.ci/apt-packages.txt lists it)"
        if IN_CI:
            pytest.fail(msg)  # in CI a missing engine is a failure, not a skip
        pytest.skip(msg)


def toolbox(*args: str, env: dict | None = None, timeout: int = 1800, check: bool = False) -> subprocess.CompletedProcess:
    """`python -m toolbox ARGS` as a user runs it; output captured (and echoed on failure)."""
    cp = subprocess.run(
        [sys.executable, "-m", "toolbox", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
    )
    if check and cp.returncode != 0:
        raise AssertionError(f"toolbox {' '.join(args)} exited {cp.returncode}\n{cp.stdout[-6000:]}\n{cp.stderr[-6000:]}")
    return cp


def podman(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["podman", *args], capture_output=True, text=True, check=check)


def ca_bundle() -> Path:
    """The host CA bundle pip needs inside builds here (PIP_CERT names it)."""
    for cand in (os.environ.get("PIP_CERT"), os.environ.get("REQUESTS_CA_BUNDLE"), "/etc/ssl/certs/ca-certificates.crt"):
        if cand and Path(cand).is_file():
            return Path(cand)
    pytest.fail("no CA bundle found (PIP_CERT unset and /etc/ssl/certs/ca-certificates.crt missing)")


def wheelhouse() -> Path:
    """The folder holding the local torch 2.13.0+cpu cp311 wheel (PyPI's Linux torch is CUDA)."""
    for cand in (*(os.environ.get("PIP_FIND_LINKS") or "").split(), "/opt/wheels"):
        if cand and Path(cand).is_dir() and any(Path(cand).glob("torch-*.whl")):
            return Path(cand)
    pytest.fail("no wheelhouse with a torch wheel (PIP_FIND_LINKS or /opt/wheels)")


