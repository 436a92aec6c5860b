"""`toolbox cluster` across two real hosts: network namespaces, a veth link, an sshd in each,
real torch.distributed (gloo) through `launch` and `finetune`.

The launcher runs inside node1's namespace (node1 is also the master), as a login node would.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

import clusterkit as ck
from clusterkit import ROOT, toolbox

pytestmark = pytest.mark.slow
_metrics = ck.metrics


def test_ddp_across_two_hosts(hosts, train_cfg, tmp_path):
    out = tmp_path / "out"
    r = toolbox(hosts, "launch", "--strategy", "ddp", "--nproc", "1", "--",
                "finetune", "--config", str(train_cfg), "--set", f"output.dir={out}-{{node_rank}}",
                "--set", "train.max_steps=8")
    log = r.stdout + r.stderr
    assert r.returncode == 0, log[-4000:]
    lines = log.splitlines()
    assert any(ln.startswith("[node1]") for ln in lines) and any(ln.startswith("[node2]") for ln in lines)
    assert "all 2 hosts have the same package versions" in log

    out0, out1 = Path(f"{out}-0"), Path(f"{out}-1")
    for rank, (node, d) in enumerate(zip(hosts.nodes, (out0, out1))):
        s = json.loads((d / "launch" / f"settings.node{rank}.json").read_text())
        assert s["world_size"] == 2 and s["nnodes"] == 2 and s["node_rank"] == rank
        assert s["master"] == f"{hosts.nodes[0].addr}:29500"
        assert s["env"]["GLOO_SOCKET_IFNAME"] == node.ifname  # traffic on the veth, not loopback
    resolved = yaml.safe_load((out0 / "config.resolved.yaml").read_text())["_resolved"]
    assert resolved["world_size"] == 2

    m = _metrics(out0)
    assert [x["step"] for x in m] == list(range(1, 9))
    assert m[-1]["loss"] < m[0]["loss"]
    # Each rank hashed its own final weights; rank 1 ran in node2's namespace.
    summary = json.loads((out0 / "summary.json").read_text())
    digests = summary["rank_weight_sha256"]
    assert len(digests) == 2 and digests[0] == digests[1]
    assert (out0 / "model.safetensors").is_file()


def test_kill_rank1_then_resume(hosts, train_cfg, tmp_path):
    out = tmp_path / "out"
    common = ["--strategy", "ddp", "--nproc", "1"]
    cmd = ["finetune", "--config", str(train_cfg), "--set", f"output.dir={out}-{{node_rank}}",
           "--set", "output.save_steps=10", "--set", "output.keep_checkpoints=50"]
    proc = toolbox(hosts, "launch", *common, "--", *cmd, "--set", "train.max_steps=5000", background=True)
    try:
        deadline = time.monotonic() + 240
        ckpt = Path(f"{out}-0") / "checkpoints" / "checkpoint-10"
        while not ckpt.is_dir():
            assert proc.poll() is None, proc.stdout.read()[-4000:]
            assert time.monotonic() < deadline, "no checkpoint within 240 s"
            time.sleep(0.2)
        pids = ck.worker_pids(hosts)
        assert set(pids) == {(0, 0), (1, 1)}, pids
        killed_at = time.monotonic()
        os.kill(pids[(1, 1)], signal.SIGKILL)
        log, _ = proc.communicate(timeout=60)
        took = time.monotonic() - killed_at
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode != 0
    assert took < 30, f"launcher took {took:.1f} s to exit after rank 1 was killed"
    assert "cluster: FAILED: node2 (node rank 1)" in log, log[-3000:]
    assert "to resume from the last checkpoint: toolbox cluster launch" in log and "--resume" in log
    gone_by = time.monotonic() + 10
    while ck.worker_pids(hosts) and time.monotonic() < gone_by:
        time.sleep(0.2)
    assert not ck.worker_pids(hosts), "training processes left running after the stop"

    done = max(x["step"] for x in _metrics(Path(f"{out}-0")))
    last = max(int(c.name.split("-")[1]) for c in (Path(f"{out}-0") / "checkpoints").glob("checkpoint-*"))
    assert done >= 10
    assert (Path(f"{out}-1") / "checkpoints" / f"checkpoint-{last}" / "trainer_state.json").is_file()
    r = toolbox(hosts, "launch", *common, "--resume", "--", *cmd, "--set", f"train.max_steps={done + 10}",
                timeout=300)
    log2 = r.stdout + r.stderr
    assert r.returncode == 0, log2[-4000:]
    m = _metrics(Path(f"{out}-0"))
    assert f"resuming from {out}-0/checkpoints/checkpoint-{last}" in log2, log2[-3000:]
    assert "no complete checkpoint" not in log2  # node2 resumed too, from its own copy
    assert [x["step"] for x in m] == list(range(1, done + 11))


def test_check_all_reduce(hosts):
    r = toolbox(hosts, "check", "--size-mib", "4", "--iters", "3", timeout=180)
    log = r.stdout + r.stderr
    assert r.returncode == 0, log[-3000:]
    assert "SSH ok on node1, node2" in log
    assert "all-reduce sum 3 (expected 3) correct on 2/2 ranks; dist-backend gloo" in log
    assert "latency" in log and "us (8 B)" in log and "GB/s algbw" in log
    a, b = hosts.nodes
    assert f"node1 {a.ifname} MTU 1500, node2 {b.ifname} MTU 1500" in log


def test_secret_reaches_host_but_never_argv(hosts):
    """HF_TOKEN travels on the SSH channel: the remote command sees it, no command line holds it."""
    token = "hf_test_" + os.urandom(6).hex()
    script = (
        "import sys; from pathlib import Path; sys.path.insert(0, %r)\n"
        "from toolbox.cluster.ssh import SshClient; from toolbox.cluster.hosts import Host\n"
        "c = SshClient(Path(%r)); env = {'HF_TOKEN': %r}\n"
        "argv = c.wrapped(Host('node2', 'node2'), ['sh', '-c', 'echo \"got=$HF_TOKEN\"; cat /proc/self/cmdline'], watch=False)\n"
        "assert %r not in ' '.join(argv)\n"
        "p = c.run(Host('node2', 'node2'), ['sh', '-c', 'echo got=$HF_TOKEN; tr \"\\\\0\" \" \" </proc/$$/cmdline'], env=env)\n"
        "print(p.stdout.decode())\n"
    ) % (str(ROOT), str(hosts.ssh_config), token, token)
    r = subprocess.run(hosts.exec_argv(hosts.nodes[0], [sys.executable, "-c", script]), capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    first, cmdline = r.stdout.splitlines()[:2]
    assert first == f"got={token}"
    assert token not in cmdline


def _with_known_hosts(hosts, tmp_path, node2_line: str | None) -> Path:
    kh = tmp_path / "known_hosts"
    lines = hosts.known_hosts.read_text().splitlines()
    lines = [ln for ln in lines if not ln.startswith(hosts.nodes[1].addr + " ")]
    if node2_line:
        lines.append(node2_line)
    kh.write_text("\n".join(lines) + "\n")
    cfg = tmp_path / "ssh_config"
    cfg.write_text(hosts.ssh_config.read_text().replace(str(hosts.known_hosts), str(kh)))
    return cfg


def test_host_key_mismatch_refused(hosts, tmp_path):
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(tmp_path / "impostor")], check=True)
    kind, key = (tmp_path / "impostor.pub").read_text().split()[:2]
    cfg = _with_known_hosts(hosts, tmp_path, f"{hosts.nodes[1].addr} {kind} {key}")
    r = toolbox(hosts, "check", ssh_config=cfg, timeout=60)
    assert r.returncode == 1
    assert "node2: host key mismatch, refusing to connect" in r.stderr
    assert f"{tmp_path / 'known_hosts'}:" in r.stderr and "SHA256:" in r.stderr
    assert "starting" not in r.stdout  # nothing ran on any host

    cfg = _with_known_hosts(hosts, tmp_path, None)
    r = toolbox(hosts, "check", ssh_config=cfg, timeout=60)
    assert r.returncode == 1 and "node2: host key not in known_hosts, refusing to connect" in r.stderr
    # The file it belongs in and the line to add (defect 3: neither was named).
    kh = tmp_path / "known_hosts"
    assert f"no line for {hosts.nodes[1].addr} (ED25519 key) in {kh}" in r.stderr, r.stderr
    assert f"ssh-keyscan -p 22 -t ed25519 {hosts.nodes[1].addr} >> {kh}" in r.stderr


@pytest.fixture(scope="module")
def cpu_image_tag(cpu_image):
    """The session's cpu image (built once for every test folder: helpers/image_fixtures.py)."""
    return cpu_image["tag"]


def test_ddp_across_two_hosts_via_podman(hosts, cpu_image_tag, tiny_model, tmp_path):
    from helpers.tiny import write_dataset, write_train_config

    wd = tmp_path / "wd"  # mounted at the same path in each node's container
    shutil.copytree(tiny_model, wd / "model")
    data = write_dataset(wd / "train.jsonl", "text", n=64)
    cfg = write_train_config(wd / "train.yaml", wd / "model", data, wd / "unused")
    r = toolbox(hosts, "launch", "--engine", "podman", "--image", cpu_image_tag, "--env", "CONTAINERS_CONF",
                "--workdir", str(wd), "--strategy", "ddp", "--nproc", "1", "--",
                "finetune", "--config", str(cfg), "--set", f"output.dir={wd}/out-{{node_rank}}",
                "--set", "train.max_steps=6",
                env={"CONTAINERS_CONF": os.environ["CONTAINERS_CONF"]})
    log = r.stdout + r.stderr
    assert r.returncode == 0, log[-4000:]
    assert "all 2 hosts have the same image id, digest and pins" in log
    lines = log.splitlines()
    assert any(ln.startswith("[node1]") for ln in lines) and any(ln.startswith("[node2]") for ln in lines)
    out0 = wd / "out-0"
    s1 = json.loads((wd / "out-1" / "launch" / "settings.node1.json").read_text())
    assert s1["world_size"] == 2 and s1["env"]["GLOO_SOCKET_IFNAME"] == hosts.nodes[1].ifname
    m = _metrics(out0)
    assert len(m) == 6 and m[-1]["loss"] < m[0]["loss"]
    digests = json.loads((out0 / "summary.json").read_text())["rank_weight_sha256"]
    assert len(digests) == 2 and digests[0] == digests[1]
    left = subprocess.run(["podman", "ps", "-a", "--filter", "name=^toolbox-", "--format", "{{.Names}}"],
                          capture_output=True, text=True).stdout.split()
    assert not [n for n in left if n.count("-") == 2], left
