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
    """Fails the test if it left a process of a run behind, and kills it either way."""
    yield
    left = ck.kill_leftovers(hosts)
    assert not left, f"processes of a cluster run left behind: {left}"


@pytest.fixture
def train_cfg(tiny_model, tmp_path):
    from helpers.tiny import write_dataset, write_train_config

    data = write_dataset(tmp_path / "train.jsonl", "text", n=64)
    return write_train_config(tmp_path / "train.yaml", tiny_model, data, tmp_path / "unused")
