"""The fault matrix: one fault per case on a two-host run (DDP, gloo, netns hosts with real
sshd), each ending with every process of the run gone on both hosts within 30 s, the master
port free, the broken host named, and the printed `--resume` line finishing with the weights of
an uninterrupted run (one reference run shared by all cases). Then a bounded soak: short
back-to-back runs, none of which may be reported failed.

What each fault gives is listed in docs/cluster.md ("What a fault gives")."""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import time
from pathlib import Path

import pytest

import clusterkit as ck
import netns_harness as nh
from clusterkit import toolbox

pytestmark = pytest.mark.slow

STEPS, SAVE = 30, 10
SOAK_RUNS = int(os.environ.get("TOOLBOX_SOAK_RUNS", "6"))  # ~3-5 min of CI on 2 cores

# Node rank 1's worker SIGKILLs itself when it opens a file whose path holds TOOLBOX_TEST_KILL_AT:
# a kill at an exact point (mid checkpoint write, in the final save), not a race with a poller.
KILL_AT_HOOK = """
import os, signal, sys
_at = os.environ.get("TOOLBOX_TEST_KILL_AT")
if _at and os.environ.get("TOOLBOX_NODE_RANK") == "1" and "LOCAL_RANK" in os.environ:
    def _hook(event, args):
        if event == "open" and isinstance(args[0], (str, os.PathLike)) and _at in os.fspath(args[0]) \
                and "w" in str(args[1] or ""):
            os.kill(os.getpid(), signal.SIGKILL)
    sys.addaudithook(_hook)
"""


def _cmd(cfg: Path, out: Path) -> list[str]:
    return ["--strategy", "ddp", "--nproc", "1", "--", "finetune", "--config", str(cfg),
            "--set", f"output.dir={out}-{{node_rank}}", "--set", f"train.max_steps={STEPS}",
            "--set", f"output.save_steps={SAVE}", "--set", "output.keep_checkpoints=10"]


@pytest.fixture(scope="module")
def cfg(tiny_model, tmp_path_factory):
    from helpers.tiny import write_dataset, write_train_config

    d = tmp_path_factory.mktemp("matrix")
    data = write_dataset(d / "train.jsonl", "text", n=64)
    return write_train_config(d / "train.yaml", tiny_model, data, d / "unused")


@pytest.fixture(scope="module")
def reference(hosts, cfg, tmp_path_factory):
    out = tmp_path_factory.mktemp("reference") / "out"
    r = toolbox(hosts, "launch", *_cmd(cfg, out))
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    return ck.weights(Path(f"{out}-0"))


@pytest.fixture(scope="module")
def hook_env(tmp_path_factory):
    d = tmp_path_factory.mktemp("hook")
    (d / "sitecustomize.py").write_text(KILL_AT_HOOK)
    return {"PYTHONPATH": os.pathsep.join(filter(None, [str(d), os.environ.get("PYTHONPATH")]))}


def _wait_for(path: Path, proc: subprocess.Popen, within: float = 300) -> None:
    deadline = time.monotonic() + within
    while not path.exists():
        assert proc.poll() is None, f"run ended before {path.name}:\n{proc.stdout.read()[-3000:]}"
        assert time.monotonic() < deadline, f"no {path} within {within:.0f} s"
        time.sleep(0.05)


def _kill(pids) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _link(hosts, up: bool) -> None:
    b = hosts.nodes[1]
    nh.sh("ip", "-n", b.netns, "link", "set", b.ifname, "up" if up else "down")
    if up:
        # ARP entries failed while the link was down ("No route to host" until they expire).
        for n in hosts.nodes:
            nh.sh("ip", "-n", n.netns, "neigh", "flush", "dev", n.ifname, check=False)
        deadline = time.monotonic() + 30
        while hosts.ssh(b, "true").returncode != 0:
            assert time.monotonic() < deadline, "node2 not reachable 30 s after the link came back"
            time.sleep(0.5)


def _slow_link(hosts, on: bool) -> str:
    """Delay (netem) where the kernel has sch_netem, else a rate limit (tbf): what was applied."""
    b = hosts.nodes[1]
    tc = ["ip", "netns", "exec", b.netns, "tc", "qdisc"]
    if not on:
        nh.sh(*tc, "del", "dev", b.ifname, "root", check=False)
        return ""
    for kind in (["netem", "delay", "40ms", "10ms", "loss", "1%"], ["tbf", "rate", "20mbit", "burst", "64kb", "latency", "200ms"]):
        if nh.sh(*tc, "replace", "dev", b.ifname, "root", *kind, check=False).returncode == 0:
            return " ".join(kind)
    pytest.skip("neither netem nor tbf qdisc available in this kernel")


# case -> (what to wait for under out-0/out-1 before the fault, the fault, what the launcher says)
CASES = {
    "worker killed in training": "FAILED: node2 (node rank 1): exit code",
    "worker killed mid checkpoint write": "FAILED: node2 (node rank 1): exit code",
    "worker killed in the final save": "FAILED: node2 (node rank 1): exit code",
    "node tree killed": "FAILED: node2 (node rank 1): exit code",
    "sshd killed": "FAILED: node2 (node rank 1): node2:",
    "link cut": "FAILED: node2 (node rank 1): node2:",
}


@pytest.mark.parametrize("case", list(CASES))
def test_fault(case, hosts, clean, cfg, reference, hook_env, tmp_path):
    out = tmp_path / "out"
    env = dict(hook_env)
    if case == "worker killed mid checkpoint write":
        env["TOOLBOX_TEST_KILL_AT"] = f"{out}-1/checkpoints/.partial-node1/checkpoint-{2 * SAVE}/"
    elif case == "worker killed in the final save":
        env["TOOLBOX_TEST_KILL_AT"] = f"{out}-1/config.json"  # the final save_pretrained, after step 30
    args = ["--env", "TOOLBOX_TEST_KILL_AT"] if "TOOLBOX_TEST_KILL_AT" in env else []
    proc = toolbox(hosts, "launch", *args, *_cmd(cfg, out), env=env, background=True)
    try:
        if case in ("worker killed in training", "node tree killed", "sshd killed", "link cut"):
            _wait_for(Path(f"{out}-0/checkpoints/checkpoint-{SAVE}"), proc)
            if case == "worker killed in training":
                _kill([ck.worker_pids(hosts)[(1, 1)]])
            elif case == "node tree killed":
                _kill(ck.node_tree(hosts, 1))
            elif case == "sshd killed":
                _kill(nh.sshd_pids(hosts.nodes[1]))
            else:
                _link(hosts, up=False)
        log, _ = proc.communicate(timeout=240)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
        if case == "link cut":
            _link(hosts, up=True)
        if case == "sshd killed":
            nh.restart_sshd(hosts, hosts.nodes[1])
    left, port = ck.wait_all_gone(hosts, within=30)
    assert not left and not port, f"left: {sorted(left)}, port: {port}\n{log[-3000:]}"
    assert proc.returncode != 0 and f"cluster: {CASES[case]}" in log, log[-3000:]
    assert "node1 (node rank 0)" not in log  # the healthy host is stopped, not blamed
    assert "is held by PID" not in log and "could not check the master port" not in log, log[-3000:]
    hint = re.search(r"cluster: to resume from the last checkpoint: (toolbox .*)", log)
    assert hint, log[-3000:]
    argv = shlex.split(hint.group(1))
    assert argv[:3] == ["toolbox", "cluster", "launch"] and "--resume" in argv
    r = ck.run_line(hosts, argv[1:], env=env | {"TOOLBOX_TEST_KILL_AT": ""}, timeout=300)
    log2 = r.stdout + r.stderr
    assert r.returncode == 0, log2[-3000:]
    assert "resuming from" in log2
    diff = ck.max_abs_diff(ck.weights(Path(f"{out}-0")), reference)
    assert diff <= 1e-6, f"max abs diff {diff}\n{log[-2500:]}\n--- resumed:\n{log2[-2500:]}"


def test_slow_link_is_not_a_failure(hosts, clean, cfg, reference, tmp_path):
    """A delayed (or rate-limited) link only slows the run: it finishes, with the same weights."""
    out = tmp_path / "out"
    applied = _slow_link(hosts, on=True)
    try:
        r = toolbox(hosts, "launch", *_cmd(cfg, out))
    finally:
        _slow_link(hosts, on=False)
    log = r.stdout + r.stderr
    assert r.returncode == 0, f"{applied}:\n{log[-3000:]}"
    assert ck.max_abs_diff(ck.weights(Path(f"{out}-0")), reference) <= 1e-6


def test_soak_back_to_back_runs(hosts, clean, cfg, tmp_path):
    """Short runs one after another on the same port: zero false failures, nothing left over."""
    failures = []
    for i in range(SOAK_RUNS):
        out = tmp_path / f"soak{i}"
        r = toolbox(hosts, "launch", "--strategy", "ddp", "--nproc", "1", "--", "finetune", "--config", str(cfg),
                    "--set", f"output.dir={out}-{{node_rank}}", "--set", "train.max_steps=2",
                    "--set", "output.save_steps=0")
        log = r.stdout + r.stderr
        if r.returncode != 0 or "cluster: all 2 nodes finished" not in log:
            failures.append(f"run {i}: rc {r.returncode}\n{log[-1500:]}")
        left, port = ck.wait_all_gone(hosts, within=30)
        assert not left and not port, f"run {i} left {sorted(left)} / port {port}"
    assert not failures, "\n".join(failures)
