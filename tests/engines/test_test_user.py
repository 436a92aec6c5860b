"""The rootless-podman test user survives a run cut short (CI on 2026-12-07 failed on this): a
user whose processes were killed with a container running, its runtime dir left behind, gets
"invalid internal status ... podman system migrate" from every podman call until set up again."""

from __future__ import annotations

import os

import pytest

from helpers.enginekit import TestUser, need

NAME = "toolbox-ci-cut"  # not the session's test user: that one is in use by other tests


def test_a_user_left_by_a_killed_run_gets_a_working_podman(base_image):
    for tool in ("podman", "runuser", "useradd", "newuidmap"):
        need(tool)
    if os.geteuid() != 0:
        pytest.skip("making a test user needs root")
    user = TestUser.make(NAME)
    user.created = True  # whoever made it first, this test removes it
    try:
        user.load_image(base_image)
        user.run(["podman", "run", "-d", "--name", "cut", base_image, "sleep", "600"], check=True)
        user._kill_processes()  # the run is cut: its processes die, its runtime dir stays
        stale = user.run(["podman", "ps", "-a"])
        assert stale.returncode != 0 and "podman system migrate" in stale.stderr, (
            "the stale state this test is about did not arise; "
            f"podman ps exited {stale.returncode}: {stale.stderr[-500:]}")

        again = TestUser.make(NAME)
        cp = again.run(["podman", "run", "--rm", base_image, "true"])
        assert cp.returncode == 0, cp.stderr[-1000:]
    finally:
        user.remove()
