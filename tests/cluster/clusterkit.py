"""What the two-host cluster tests share: running `toolbox cluster` from node1's namespace,
finding a run's processes on both hosts, the master port's listener, and final weights."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import netns_harness as nh

ROOT = Path(__file__).resolve().parents[2]
VENV_BIN = str(Path(sys.executable).parent)
PORT = 29500


def toolbox(cluster, *args: str, ssh_config: Path | None = None, env: dict | None = None, timeout: float = 400,
            background: bool = False):
    full_env = {**os.environ, "COLUMNS": "200", **(env or {})}
    # The nodes run this checkout's toolbox_train (PYTHONPATH travels on the SSH channel, as --env).
    fwd = ["--env", "PYTHONPATH"] if full_env.get("PYTHONPATH") and args[0] == "launch" else []
    argv = cluster.exec_argv(cluster.nodes[0], [
        sys.executable, "-m", "toolbox", "cluster", args[0], "-F", str(ssh_config or cluster.ssh_config),
        "--hosts", ",".join(n.name for n in cluster.nodes), "--engine", "none", "--remote-path", VENV_BIN,
        "--cpu", *fwd, *args[1:]])
    if background:
        return subprocess.Popen(argv, cwd=ROOT, env=full_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    proc = subprocess.Popen(argv, cwd=ROOT, env=full_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGINT)  # the launcher stops every node on Ctrl-C
        try:
            out, err = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
        pytest.fail(f"toolbox cluster {args[0]} still running after {timeout:.0f} s:\n{(out + err)[-5000:]}")
    return subprocess.CompletedProcess(argv, proc.returncode, out, err)


def run_line(cluster, argv: list[str], env: dict | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    """`toolbox ARGV` exactly as given (e.g. the `--resume` line the launcher printed), from node1."""
    return subprocess.run(cluster.exec_argv(cluster.nodes[0], [sys.executable, "-m", "toolbox", *argv]), cwd=ROOT,
                          env={**os.environ, "COLUMNS": "200", **(env or {})}, capture_output=True, text=True,
                          timeout=timeout)


def metrics(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]


def _environ(pid: str) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes().decode(errors="replace")
    return dict(kv.split("=", 1) for kv in raw.split("\0") if "=" in kv)


def run_pids(cluster) -> dict[int, dict[str, str]]:
    """pid -> environment of every live process a cluster run started on either host (only
    processes inside this harness's namespaces: other test runs on the machine are not ours)."""
    found = {}
    for node in cluster.nodes:
        for pid in nh.sh("ip", "netns", "pids", node.netns, check=False).stdout.split():
            try:
                env = _environ(pid)
            except OSError:
                continue
            if "TOOLBOX_CLUSTER_RUN" in env:
                found[int(pid)] = env
    return found


def worker_pids(cluster) -> dict[tuple[int, int], int]:
    """(node rank, RANK) -> pid of the training workers (torchrun sets RANK; its agent has none)."""
    out = {}
    for pid, env in run_pids(cluster).items():
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if "RANK" in env and b"toolbox_train.commands.finetune" in cmd and b"accelerate" not in cmd:
            out[(int(env["TOOLBOX_NODE_RANK"]), int(env["RANK"]))] = pid
    return out


def node_tree(cluster, rank: int) -> list[int]:
    return [pid for pid, env in run_pids(cluster).items() if env.get("TOOLBOX_NODE_RANK") == str(rank)]


def port_listeners(cluster, port: int = PORT) -> str:
    r = nh.sh(*nh.netns_argv(cluster.nodes[0], ["ss", "-Hltnp", f"sport = :{port}"]), check=False)
    return r.stdout.strip()


def wait_all_gone(cluster, within: float = 30) -> tuple[dict, str]:
    """Wait until no process of any run is left and the master port is free; what is left."""
    deadline = time.monotonic() + within
    while True:
        left, port = run_pids(cluster), port_listeners(cluster)
        if (not left and not port) or time.monotonic() > deadline:
            return left, port
        time.sleep(0.5)


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return "?"


def kill_leftovers(cluster) -> dict[int, str]:
    """Clean up after a failed test, so one leftover does not fail the next test too; what was killed
    (pid -> command line, read before the kill)."""
    left = {pid: cmdline(pid) for pid in run_pids(cluster)}
    for pid in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return left


def weights(out: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(str(out / "model.safetensors"))


def max_abs_diff(a: dict, b: dict) -> float:
    assert a.keys() == b.keys()
    return max(float((a[k].float() - b[k].float()).abs().max()) for k in a)
