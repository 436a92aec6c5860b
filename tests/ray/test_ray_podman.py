"""`toolbox cluster ray up|status|down --engine podman`: Ray in a detached container on each of two
netns hosts (their own pair, beside the session's cluster), the driver in the head's container,
a 2-node DDP fine-tune across them; the token on no command line and in no container's
configuration; `down` leaves no container and no token behind. The image: the session's cpu
image with ray[train] added (the cpu stack leaves Ray out to stay lean)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import netns_harness as nh
from helpers.enginekit import podman
from helpers.prebuilt import ensure_ray_image
from helpers.tiny import write_dataset, write_train_config

ROOT = Path(__file__).resolve().parents[2]
PORT = 6391
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def ray_image(cpu_image) -> str:
    """The cpu image plus ray[train] (helpers/prebuilt.py; tests/prebuild.py makes it before pytest)."""
    return ensure_ray_image(cpu_image["tag"])


@pytest.fixture(scope="module")
def podman_hosts(tmp_path_factory):
    nh.require("ray")
    hosts = nh.start(tmp_path_factory.mktemp("rayp") / "h", tag=f"q{os.getpid() % 100000}"[:6])
    try:
        yield hosts
    finally:
        nh.stop(hosts)


def _toolbox(hosts, state: Path, image: str, workdir: Path, ray_dir: str, *args: str):
    argv = nh.netns_argv(hosts.nodes[0], [
        sys.executable, "-m", "toolbox", "cluster", "ray", *args, "-F", str(hosts.ssh_config),
        "--hosts", ",".join(n.name for n in hosts.nodes), "--engine", "podman", "--image", image,
        "--workdir", str(workdir), "--port", str(PORT), "--cpu", "--env", "CONTAINERS_CONF",
        "--env", "OMP_NUM_THREADS", "--env", "HF_HUB_OFFLINE", "--env", "HF_TOKEN", "--ray-dir", ray_dir])
    env = {**os.environ, "COLUMNS": "200", "TOOLBOX_STATE_DIR": str(state), "OMP_NUM_THREADS": "1",
           "HF_HUB_OFFLINE": "1", "HF_TOKEN": "hf_not_a_real_token_but_secret", "PYTHONPATH": str(ROOT)}
    return subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)


def _in_head(hosts, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(nh.netns_argv(hosts.nodes[0], ["podman", *args]), capture_output=True, text=True,
                          timeout=600)


def test_ray_in_podman_containers_runs_a_two_node_fine_tune(podman_hosts, ray_image, tiny_model, tmp_path):
    hosts = podman_hosts
    wd = tmp_path / "wd"  # mounted at the same path in both containers: the shared storage
    shutil.copytree(tiny_model, wd / "model")
    data = write_dataset(wd / "train.jsonl", "text", n=64)
    cfg = write_train_config(wd / "train.yaml", wd / "model", data, wd / "out", **{
        "train.max_steps": 6, "train.per_device_batch_size": 2, "train.batch_size": 8})
    state = tmp_path / "state"
    ray_dir = f"/tmp/tbrp{os.getpid() % 100000}-{{node_rank}}"
    names = [f"toolbox-ray-{PORT}-{n.name}" for n in hosts.nodes]
    try:
        r = _toolbox(hosts, state, ray_image, wd, ray_dir, "up")
        assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]
        assert r.stdout.count("ray: started (container toolbox-ray-") == 2, r.stdout
        token = (state / "ray" / "auth_token").read_text().strip()
        for name in names:  # the token and HF_TOKEN: neither in the container's arguments nor its environment
            inspect = podman("container", "inspect", name).stdout
            assert token not in inspect and "hf_not_a_real_token" not in inspect, name
        r = _toolbox(hosts, state, ray_image, wd, ray_dir, "status")
        assert r.returncode == 0 and r.stdout.count("ray: running (container") == 2, r.stdout + r.stderr
        assert "Active:" in r.stdout, r.stdout
        r = _toolbox(hosts, state, ray_image, wd, ray_dir, "up")  # running: nothing started twice
        assert r.returncode == 0 and r.stdout.count("already running") == 2, r.stdout + r.stderr

        # The driver in the head's container, from the head's shell as a user would run it: a
        # host-network container records no network namespace, so `podman exec` runs in the caller's.
        head_dir = ray_dir.format(node_rank=0)
        run = _in_head(hosts, "exec", "-e", f"RAY_AUTH_TOKEN_PATH={head_dir}/auth_token", "-e", "OMP_NUM_THREADS=1",
                     "-e", "HF_HUB_OFFLINE=1", "-w", str(wd), names[0],
                     "launch", "--launcher", "ray", "--address", f"{hosts.nodes[0].addr}:{PORT}", "--nodes", "2",
                     "--nproc", "1", "--cpu", "--strategy", "ddp", "--", "finetune", "--config", str(cfg), "--json")
        assert run.returncode == 0, (run.stdout + run.stderr)[-6000:]
        summary = json.loads(run.stdout.strip().splitlines()[-1])
        assert summary["steps"] == 6
        digests = summary["rank_weight_sha256"]
        assert len(digests) == 2 and digests[0] == digests[1]
        settings = json.loads((wd / "out" / "launch" / "settings.node0.json").read_text())
        assert settings["launcher"] == "ray" and settings["world_size"] == 2
    finally:
        r = _toolbox(hosts, state, ray_image, wd, ray_dir, "down")
    assert r.returncode == 0 and r.stdout.count("ray: stopped (container") == 2, r.stdout + r.stderr
    for rank, name in enumerate(names):
        assert podman("container", "exists", name, check=False).returncode == 1, name
        assert not (Path(ray_dir.format(node_rank=rank)) / "auth_token").exists()
    for rank in (0, 1):
        shutil.rmtree(ray_dir.format(node_rank=rank), ignore_errors=True)
