"""`.ci/setup engine` (make image's set-up) and `toolbox build` agree on what a container engine is:
one that answers (`podman info` exits 0, the Docker API pings), never a client binary alone. The
case that broke make image on a fresh machine: a docker CLI without a daemon, no podman; setup
counted the CLI, then `toolbox build` stopped at "no container engine found".

The engines here are stand-ins on a PATH of their own (a real daemonless docker CLI behaves the
same: it exits 1 for anything but --version), and apt-get is not on that PATH, so setup prints
the install command instead of installing (its root branch is what make image runs on CI)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TOOLS = ("bash", "sh", "dirname", "id", "cat", "sed", "sha256sum", "cut", "grep", "env")


@pytest.fixture
def host(tmp_path):
    """A bin folder with the shell tools setup needs, a venv stand-in running this checkout's
    toolbox, a docker CLI whose daemon is not there; DOCKER_HOST names a socket nobody serves."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in TOOLS:
        found = shutil.which(tool)
        if found:
            (bin_dir / tool).symlink_to(found)
    stub(bin_dir, "docker", 'case "$1" in --version) echo "Docker version 28.1.1, build 4eba377";; '
                            '*) echo "Cannot connect to the Docker daemon at unix:///var/run/docker.sock." >&2; exit 1;; esac')
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    stub(venv / "bin", "python", f'exec {sys.executable} "$@"')
    env = {"PATH": str(bin_dir), "VENV": str(venv), "HOME": str(tmp_path),
           "PYTHONPATH": f"{ROOT}{os.pathsep}{ROOT / 'entrypoints'}",
           "DOCKER_HOST": f"unix://{tmp_path}/no-daemon.sock"}
    return bin_dir, env


def stub(folder: Path, name: str, body: str) -> None:
    (folder / name).write_text(f"#!/bin/sh\n{body}\n")
    (folder / name).chmod(0o755)


def setup_engine(env, **extra) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(ROOT / ".ci/setup"), "engine"], cwd=ROOT, env={**env, **extra},
                          capture_output=True, text=True, timeout=120)


def build(env) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "toolbox", "build", "--stack", "cpu", "--dry-run"], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=120)


def test_docker_cli_without_daemon_is_no_engine_for_either(host):
    bin_dir, env = host
    setup, tb = setup_engine(env), build(env)
    assert (setup.returncode == 0) == (tb.returncode == 0), (setup.stderr, tb.stderr)  # they agree
    assert setup.returncode == 1, setup.stderr
    assert "docker: the Docker API at" in setup.stderr and "does not answer" in setup.stderr
    # no apt-get here: the one command to run, on stdout
    assert setup.stdout.strip().endswith("apt-get install -y podman runc uidmap"), setup.stdout
    assert tb.returncode == 1 and "no container engine found that answers" in tb.stderr, tb.stderr
    assert "docker: the Docker API at" in tb.stderr


def test_podman_that_does_not_answer_is_no_engine_for_either(host):
    bin_dir, env = host
    stub(bin_dir, "podman", '[ "$1" = info ] && { echo "Error: cannot set up namespace: permission denied" >&2; exit 125; }; exit 0')
    setup, tb = setup_engine(env), build(env)
    assert setup.returncode == 1 and tb.returncode == 1, (setup.stderr, tb.stderr)
    assert "`podman info` exited 125: Error: cannot set up namespace" in setup.stderr
    assert "`podman info` exited 125" in tb.stderr


def test_podman_that_answers_is_the_engine_for_both(host):
    bin_dir, env = host
    stub(bin_dir, "podman", '[ "$1" = info ] && { echo runc; exit 0; }; echo "Error: stand-in" >&2; exit 1')
    setup, tb = setup_engine(env), build(env)
    assert setup.returncode == 0 and "setup: container engine: podman" in setup.stderr, setup.stderr
    assert tb.returncode == 0, tb.stderr
    assert any(line.startswith("podman build ") for line in tb.stdout.splitlines()), tb.stdout
    # ENGINE=docker asks for Docker alone: it does not answer, though podman does
    setup = setup_engine(env, ENGINE="docker")
    assert setup.returncode == 1 and "apt-get install -y docker.io" in setup.stdout, setup.stdout


def test_unknown_engine_is_exit_2(host):
    _bin, env = host
    setup = setup_engine(env, ENGINE="lxc")
    assert setup.returncode == 2 and "ENGINE=lxc: choose one of podman, docker" in setup.stderr
