"""`toolbox cluster ray up|status|down` on the netns hosts: what the session's cluster runs with
(token auth, the token never on a command line, node IPs and GPU counts given, the network
settings in the nodes' environment), status, and up being safe to run again."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

import netns_harness as nh

pytestmark = pytest.mark.slow


def _ray_processes(cluster) -> dict[int, tuple[str, dict[str, str]]]:
    """pid -> (command line, environment) of every process in the two namespaces but sshd."""
    found = {}
    for node in cluster.hosts.nodes:
        for pid in nh.sh("ip", "netns", "pids", node.netns, check=False).stdout.split():
            try:
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                raw = Path(f"/proc/{pid}/environ").read_bytes().decode(errors="replace")
            except OSError:
                continue
            if "sshd" not in cmd:
                found[int(pid)] = (cmd, dict(kv.split("=", 1) for kv in raw.split("\0") if "=" in kv))
    return found


def test_up_started_both_nodes_with_auth_and_the_network_settings(ray_cluster):
    token_file = ray_cluster.state_dir / "ray" / "auth_token"
    token = token_file.read_text().strip()
    assert len(token) == 64 and stat.S_IMODE(token_file.stat().st_mode) == 0o600
    for rank in (0, 1):
        node_copy = Path(ray_cluster.ray_dir.format(node_rank=rank)) / "auth_token"
        assert node_copy.read_text() == token and stat.S_IMODE(node_copy.stat().st_mode) == 0o600
    procs = _ray_processes(ray_cluster)
    raylets = {pid: env for pid, (cmd, env) in procs.items() if "/raylet " in cmd or cmd.startswith("raylet")}
    assert len(raylets) == 2, {p: c for p, (c, _) in procs.items()}
    for pid, (cmd, env) in procs.items():
        assert token not in cmd, f"the token is on the command line of {pid}: {cmd[:200]}"
    ifnames = {n.ifname for n in ray_cluster.hosts.nodes}
    for env in raylets.values():
        assert env.get("RAY_AUTH_MODE") == "token" and "RAY_AUTH_TOKEN" not in env
        assert env.get("GLOO_SOCKET_IFNAME") in ifnames and env.get("NCCL_IB_DISABLE") == "1"
    starts = [cmd for cmd, _ in procs.values() if "ray start" in cmd]
    assert len(starts) == 2 and all("--node-ip-address 10.231.0." in c and "--num-gpus 0" in c for c in starts), starts


def test_status_and_up_again(ray_cluster):
    r = ray_cluster.toolbox("status")
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.count("ray: running") == 2 and "Active:" in r.stdout, r.stdout
    r = ray_cluster.toolbox("up")  # both running: nothing started twice
    assert r.returncode == 0 and r.stdout.count("already running") == 2, r.stdout + r.stderr
