"""`launch --launcher ray` on a real two-node Ray cluster (netns hosts, `toolbox cluster ray up`):
the same fine-tune as torchrun, to the same weights; a node killed mid-run and Ray's restart
from the last checkpoint, to the same weights; `--resume` across launchers."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers.tiny import write_dataset, write_train_config

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow
STEPS = 12


def _weights(out: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(str(out / "model.safetensors"))


def _same(a: Path, b: Path) -> None:
    wa, wb = _weights(a), _weights(b)
    assert wa.keys() == wb.keys()
    diff = {k: float((wa[k] - wb[k]).abs().max()) for k in wa}
    assert max(diff.values()) == 0.0, {k: v for k, v in diff.items() if v}


def _cfg(tmp: Path, model: Path, out: Path, name: str) -> Path:
    data = tmp / "d.jsonl"
    if not data.exists():
        write_dataset(data, "text", n=64)
    return write_train_config(tmp / f"{name}.yaml", model, data, out, **{
        "train.max_steps": STEPS, "train.per_device_batch_size": 2, "train.batch_size": 8, "output.save_steps": 3})


@pytest.fixture(scope="module")
def torchrun_run(tmp_path_factory, tiny_model):
    """The reference: the same config through torchrun (launch, 2 gloo ranks on one host)."""
    tmp = tmp_path_factory.mktemp("torchrun")
    out = tmp / "out"
    cfg = _cfg(tmp, tiny_model, out, "torchrun")
    env = {**os.environ, "PYTHONPATH": str(ROOT / "entrypoints"), "OMP_NUM_THREADS": "1"}
    for k in ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME", "RANK", "WORLD_SIZE", "LOCAL_RANK"):
        env.pop(k, None)
    r = subprocess.run([sys.executable, "-m", "toolbox_train.commands.launch", "--strategy", "ddp", "--nproc",
                        "2", "--cpu", "--", "finetune", "--config", str(cfg)], env=env, capture_output=True,
                       text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-4000:]
    return tmp, out


def _ray(cluster, cfg: Path, *extra: str, **kw):
    return cluster.launch("--launcher", "ray", "--address", cluster.address, "--nodes", "2", "--nproc", "1", "--cpu",
                          "--strategy", "ddp", *extra, "--", "finetune", "--config", str(cfg), "--json", **kw)


def test_two_node_ddp_equals_torchrun(ray_cluster, torchrun_run, tiny_model, tmp_path):
    out = tmp_path / "out"
    r = _ray(ray_cluster, _cfg(tmp_path, tiny_model, out, "ray"))
    assert r.returncode == 0, (r.stdout + r.stderr)[-6000:]
    summary = json.loads(r.stdout.strip().splitlines()[-1])
    assert summary["steps"] == STEPS
    digests = summary["rank_weight_sha256"]
    assert len(digests) == 2 and digests[0] == digests[1]
    settings = json.loads((out / "launch" / "settings.node0.json").read_text())
    assert settings["launcher"] == "ray" and settings["world_size"] == 2
    _same(out, torchrun_run[1])
    steps = [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert steps == list(range(1, STEPS + 1))  # rank 0 alone logs, every step once


def test_worker_node_killed_restarts_from_checkpoint(ray_cluster, torchrun_run, tiny_model, tmp_path):
    out = tmp_path / "out"
    cfg = _cfg(tmp_path, tiny_model, out, "ray")
    ready = tmp_path / "blocked"
    trigger = ray_cluster.hook_dir / "block-after"
    trigger.write_text(f"6 {ready}\n")
    try:
        proc = _ray(ray_cluster, cfg, "--max-restarts", "2", background=True)
        deadline = time.monotonic() + 400
        while not ready.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        assert ready.exists(), "node 2's worker never reached checkpoint 6:\n" + "".join(proc.communicate()[1])[-4000:]
        ray_cluster.kill_node(1)  # the raylet, its workers, `ray start`: the whole node, mid-run
        r = ray_cluster.toolbox("up")  # the node comes back; the head is left as it is
        assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
        assert "already running" in r.stdout
        so, se = proc.communicate(timeout=600)
    finally:
        trigger.unlink(missing_ok=True)
    assert proc.returncode == 0, (so + se)[-6000:]
    assert "resuming from" in se and "checkpoint-6" in se
    assert json.loads(so.strip().splitlines()[-1])["steps"] == STEPS
    _same(out, torchrun_run[1])  # as if never interrupted


def test_resume_across_launchers(ray_cluster, torchrun_run, tiny_model, tmp_path):
    """Stopped after step 6 under Ray, resumed under torchrun: the same weights."""
    out = tmp_path / "out"
    cfg = _cfg(tmp_path, tiny_model, out, "ray")
    r = _ray(ray_cluster, cfg, env={"TOOLBOX_STOP_AFTER_STEP": "6"})
    assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]
    env = {**os.environ, "PYTHONPATH": str(ROOT / "entrypoints"), "OMP_NUM_THREADS": "1"}
    r = subprocess.run([sys.executable, "-m", "toolbox_train.commands.launch", "--strategy", "ddp", "--nproc",
                        "2", "--cpu", "--", "finetune", "--config", str(cfg), "--resume"], env=env,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-4000:]
    assert "resuming from" in r.stderr and "checkpoint-6" in r.stderr
    _same(out, torchrun_run[1])


def test_head_dying_ends_the_run_with_one_line_and_the_resume_command(ray_cluster, tiny_model, tmp_path):
    """Last user of the session's cluster (it is started again at the end): the head's Ray is
    killed mid-run, the driver beside it left alive."""
    out = tmp_path / "out"
    cfg = _cfg(tmp_path, tiny_model, out, "ray")
    ready = tmp_path / "blocked"
    trigger = ray_cluster.hook_dir / "block-after"
    trigger.write_text(f"6 {ready}\n")
    try:
        proc = _ray(ray_cluster, cfg, "--max-restarts", "2", background=True)
        deadline = time.monotonic() + 400
        while not ready.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        assert ready.exists(), "node 2's worker never reached checkpoint 6:\n" + proc.communicate()[1][-4000:]
        ray_cluster.kill_node(0, spare=(proc.pid,))  # GCS, raylet, `ray start`: the head is gone
        so, se = proc.communicate(timeout=600)
    finally:
        trigger.unlink(missing_ok=True)
        ray_cluster.kill_node(1)  # its worker still waits at checkpoint 6
        ray_cluster.toolbox("up")
    ours = [ln for ln in se.splitlines() if ln.startswith("launch: error")]
    assert proc.returncode == 1 and len(ours) == 1, se[-4000:]
    assert f"the Ray head {ray_cluster.address} went away during the run" in ours[0], ours[0]
    assert ours[0].endswith(f"-- finetune --config {cfg} --json --resume"), ours[0]
    assert "Traceback" not in se
