"""Fixtures of the two-host cluster tests (netns_harness: namespaces, a veth link, an sshd each)."""

from __future__ import annotations

import os

import pytest

import clusterkit as ck
import netns_harness as nh


@pytest.fixture(scope="module")
def hosts(tmp_path_factory):
    nh.require("cluster")
    cluster = nh.start(tmp_path_factory.mktemp("cluster") / "h", tag=str(os.getpid() % 100000))
    try:
        yield cluster
    finally:
        nh.stop(cluster)


@pytest.fixture
def clean(hosts):
    """Fails the test if it left a process of a run behind, and kills it either way. A run's processes
    get the 30 s to exit that the tests give them after a fault (wait_all_gone): on a loaded 2-core
    machine a remote node's processes were seen still exiting just after a resumed run returned 0."""
    yield
    ck.wait_all_gone(hosts, within=30)
    left = ck.kill_leftovers(hosts)
    assert not left, f"processes of a cluster run left behind 30 s after the test: {left}"


@pytest.fixture
def train_cfg(tiny_model, tmp_path):
    from helpers.tiny import write_dataset, write_train_config

    data = write_dataset(tmp_path / "train.jsonl", "text", n=64)
    return write_train_config(tmp_path / "train.yaml", tiny_model, data, tmp_path / "unused")
