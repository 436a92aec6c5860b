"""`launch --launcher ray` refusing what cannot work, in one line, exit 2, nothing written: no Ray
at the address, a cluster without token authentication, fewer nodes or GPUs than asked, flags
that belong to the other launcher. Against the session's real two-node cluster."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import netns_harness as nh
from helpers.tiny import write_dataset, write_train_config

pytestmark = pytest.mark.slow


@pytest.fixture
def cfg(tmp_path, tiny_model):
    data = write_dataset(tmp_path / "d.jsonl", "text", n=16)
    return write_train_config(tmp_path / "train.yaml", tiny_model, data, tmp_path / "out",
                              **{"train.max_steps": 2, "train.per_device_batch_size": 2, "train.batch_size": 4})


def _refused(r, *needles: str) -> str:
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert r.returncode == 2, r.stdout + r.stderr
    assert len(lines) == 1 and lines[0].startswith("launch: error: "), r.stderr
    for n in needles:
        assert n in lines[0], lines[0]
    assert "Traceback" not in r.stderr
    return lines[0]


def _launch(cluster, cfg, *opts: str, env=None):
    return cluster.launch("--launcher", "ray", "--strategy", "ddp", *opts, "--", "finetune", "--config", str(cfg),
                          env=env, timeout=300)


def test_no_ray_at_the_address(ray_cluster, cfg):
    r = _launch(ray_cluster, cfg, "--address", f"{ray_cluster.hosts.nodes[1].addr}:6390", "--nodes", "2", "--cpu")
    _refused(r, "--address", "6390", "no Ray head there")
    assert not (cfg.parent / "out").exists()


def test_more_nodes_than_the_cluster_has(ray_cluster, cfg):
    r = _launch(ray_cluster, cfg, "--address", ray_cluster.address, "--nodes", "3", "--cpu")
    _refused(r, "--nodes 3", "2 node(s)")
    assert not (cfg.parent / "out").exists()


def test_fewer_gpus_than_asked(ray_cluster, cfg):
    # The cluster was started with --cpu: Ray was told 0 GPUs per node (never left to guess).
    r = _launch(ray_cluster, cfg, "--address", ray_cluster.address, "--nodes", "2")
    _refused(r, "GPU", "0 node(s)")


def test_token_missing_on_the_driver(ray_cluster, cfg, tmp_path):
    r = _launch(ray_cluster, cfg, "--address", ray_cluster.address, "--nodes", "2", "--cpu",
                env={"RAY_AUTH_TOKEN_PATH": str(tmp_path / "none"), "HOME": str(tmp_path)})
    _refused(r, "token", "RAY_AUTH_TOKEN_PATH")


def test_flags_of_the_other_launcher(ray_cluster, cfg):
    from toolbox_train.commands import launch

    for argv, needle in ((["--address", "10.0.0.1:6379"], "--address: only with --launcher ray"),
                         (["--launcher", "ray"], "--launcher ray needs --address"),
                         (["--launcher", "ray", "--address", "nowhere"], "expected HOST:PORT"),
                         (["--launcher", "ray", "--address", "10.0.0.1:6379", "--master-port", "29500"],
                          "--master-port: not used with --launcher ray")):
        r = subprocess.run([sys.executable, "-m", "toolbox_train.commands.launch", "--strategy", "ddp", "--cpu",
                            *argv, "--", "finetune", "--config", str(cfg)], capture_output=True, text=True,
                           env={**os.environ, "PYTHONPATH": str(Path(launch.__file__).parents[2])}, timeout=120)
        _refused(r, needle)


def test_cluster_without_token_authentication(ray_cluster, cfg, tmp_path):
    """A head started without authentication (as plain `ray start --head` did before 2.5x): refused,
    and the line says why; --insecure is the only way past."""
    node = ray_cluster.hosts.nodes[1]
    ray_bin = str(Path(sys.executable).with_name("ray"))
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_AUTH")}
    head = subprocess.Popen(nh.netns_argv(node, [
        ray_bin, "start", "--head", "--port", "6391", "--node-ip-address", node.addr, "--num-cpus", "0",
        "--num-gpus", "0", "--include-dashboard", "false", "--disable-usage-stats", "--temp-dir",
        f"/tmp/tbopen{os.getpid() % 100000}", "--block"]),
        env={**env, "RAY_AUTH_MODE": "disabled", "HOME": str(tmp_path)}, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        for line in head.stdout:  # until Ray says it is up (or exits)
            if "Ray runtime started" in line:
                break
        assert head.poll() is None, "the unauthenticated head did not start"
        r = _launch(ray_cluster, cfg, "--address", f"{node.addr}:6391", "--nodes", "1", "--cpu")
        _refused(r, "no token authentication", "--insecure", "run any code")
        assert not (cfg.parent / "out").exists()
    finally:
        head.terminate()  # `ray start --block` stops what it started on TERM
        try:
            head.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(head.pid, 9)
            head.wait()
        subprocess.run(["rm", "-rf", f"/tmp/tbopen{os.getpid() % 100000}"], check=False)


def test_output_folder_not_shared_with_every_node(ray_cluster, tiny_model, tmp_path):
    """output.dir in a folder node2 has on its own disk: refused before anything is written there."""
    data = write_dataset(tmp_path / "d.jsonl", "text", n=16)
    out = ray_cluster.private / "out"
    cfg = write_train_config(tmp_path / "train.yaml", tiny_model, data, out, **{"train.max_steps": 2})
    r = _launch(ray_cluster, cfg, "--address", ray_cluster.address, "--nodes", "2", "--cpu",
                env={"HF_DATASETS_DISABLE_PROGRESS_BARS": "1"})
    _refused(r, f"output.dir {out}: not shared with node {ray_cluster.hosts.nodes[1].addr}", "NFS")
    assert not list(ray_cluster.private.iterdir())  # the check's file is gone, no output folder made
