"""One two-node Ray cluster per session for tests/ray: the two network-namespace hosts of
tests/cluster (a veth link, an sshd each), Ray started on them by `toolbox cluster ray up` over
SSH, as a user would. Real Ray processes; nothing of Ray is mocked."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "cluster"))
import netns_harness as nh  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
VENV_BIN = str(Path(sys.executable).parent)
PORT = 6379

# Inert unless the test writes its trigger: on node rank 1, the Ray worker that publishes the
# named checkpoint then writes the ready file and waits, so the test can kill that node at a
# known step (the kill itself is real: every process of the node's namespace). Installed as an
# import hook because Ray may start its worker processes before the test writes the trigger.
HOOK = r'''
import os, sys
_TRIGGER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "block-after")
if os.environ.get("TOOLBOX_NODE_RANK") == "1":
    import importlib.abc, importlib.util, time

    class _Finder(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path, target=None):
            if name != "toolbox_train.runs.checkpoints" or not os.path.exists(_TRIGGER):
                return None
            sys.meta_path.remove(self)
            spec = importlib.util.find_spec(name)
            run = spec.loader.exec_module

            def exec_module(module):
                run(module)
                publish = module.publish

                def blocking(src, dst):
                    publish(src, dst)
                    step, ready = open(_TRIGGER).read().split()
                    if dst.name == "checkpoint-" + step:
                        try:
                            os.rename(_TRIGGER, _TRIGGER + ".fired")  # once: the restarted node trains on
                        except OSError:
                            return
                        with open(ready, "w") as f:
                            f.write(str(os.getpid()))
                        time.sleep(3600)

                module.publish = blocking

            spec.loader.exec_module = exec_module
            return spec

    sys.meta_path.insert(0, _Finder())
'''


def private_dir_on_node2(hosts: nh.TwoHosts, private: Path) -> None:
    """Give node2 a folder of its own: its sshd (so all it starts, Ray included) runs in a mount
    namespace with a tmpfs over `private`, as on a host whose local disk has that path."""
    node = hosts.nodes[1]
    private.mkdir(parents=True, exist_ok=True)
    os.kill(node.sshd_pid, 9)
    os.waitpid(node.sshd_pid, 0)
    conf = hosts.root / f"sshd_{node.name}.conf"
    proc = subprocess.Popen(nh.netns_argv(node, [
        "unshare", "--mount", "--propagation", "private", "sh", "-c",
        f"mount -t tmpfs tmpfs {private} && exec /usr/sbin/sshd -D -e -f {conf}"]),
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=open(hosts.root / "sshd_node2.log", "ab"))
    node.sshd_pid = proc.pid
    nh._wait_port(node, time.monotonic() + 15)


@dataclass
class RayCluster:
    hosts: nh.TwoHosts
    address: str
    token_path: Path  # the head's copy, as `cluster ray up` left it
    hook_dir: Path
    ray_dir: str
    state_dir: Path
    private: Path  # a folder node2 has on its own (not shared)

    def toolbox(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
        """`toolbox cluster ray ACTION` from node1 over the harness's SSH."""
        action, rest = args[0], args[1:]
        argv = nh.netns_argv(self.hosts.nodes[0], [
            sys.executable, "-m", "toolbox", "cluster", "ray", action, "-F", str(self.hosts.ssh_config),
            "--hosts", ",".join(n.name for n in self.hosts.nodes), "--engine", "none", "--remote-path", VENV_BIN,
            "--cpu", "--env", "PYTHONPATH", "--env", "OMP_NUM_THREADS", "--env", "HF_HUB_OFFLINE",
            "--ray-dir", self.ray_dir, *rest])
        env = {**os.environ, "COLUMNS": "200", "TOOLBOX_STATE_DIR": str(self.state_dir), "OMP_NUM_THREADS": "1",
               "PYTHONPATH": os.pathsep.join([str(self.hook_dir), str(ROOT / "entrypoints")])}
        return subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)

    def launch(self, *args: str, env: dict | None = None, timeout: float = 600,
               background: bool = False):
        """`launch ARGS` on the head's namespace (the driver runs on a node of the cluster)."""
        argv = nh.netns_argv(self.hosts.nodes[0], [sys.executable, "-m", "toolbox_train.commands.launch", *args])
        full = {**os.environ, "PYTHONPATH": str(ROOT / "entrypoints"), "OMP_NUM_THREADS": "1",
                "RAY_AUTH_TOKEN_PATH": str(self.token_path), **(env or {})}
        for k in ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME", "RANK", "WORLD_SIZE", "LOCAL_RANK"):
            full.pop(k, None)
        if background:
            return subprocess.Popen(argv, env=full, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        return subprocess.run(argv, env=full, capture_output=True, text=True, timeout=timeout)

    def kill_node(self, index: int, spare: tuple[int, ...] = ()) -> None:
        """Every process of that host but its sshd (and `spare`): the raylet, its workers, `ray start`."""
        node = self.hosts.nodes[index]
        keep = set(nh.sshd_pids(node)) | set(spare)
        for pid in nh.sh("ip", "netns", "pids", node.netns, check=False).stdout.split():
            if int(pid) not in keep:
                try:
                    os.kill(int(pid), 9)
                except ProcessLookupError:
                    pass


@pytest.fixture(scope="session")
def ray_cluster(tmp_path_factory):
    nh.require("ray")
    pytest.importorskip("ray", reason="the `ray` extra is not installed")
    root = tmp_path_factory.mktemp("ray")
    tag = str(os.getpid() % 100000)
    hosts = nh.start(root / "h", tag=f"r{tag}"[:6])
    private = Path(f"/tmp/tbpriv{tag}")
    private_dir_on_node2(hosts, private)
    hook = root / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(HOOK)
    # Short: Ray's unix sockets live under it (108-byte limit on their paths).
    ray_dir = f"/tmp/tbray{tag}-{{node_rank}}"
    cluster = RayCluster(hosts, f"{hosts.nodes[0].addr}:{PORT}", Path(ray_dir.format(node_rank=0)) / "auth_token",
                         hook, ray_dir, root / "state", private)
    try:
        r = cluster.toolbox("up")
        if r.returncode != 0:
            raise RuntimeError(f"toolbox cluster ray up failed:\n{(r.stdout + r.stderr)[-4000:]}")
        yield cluster
    finally:
        cluster.toolbox("down", timeout=120)
        nh.stop(hosts)
        for i in (0, 1):
            subprocess.run(["rm", "-rf", ray_dir.format(node_rank=i)], check=False)
        subprocess.run(["rm", "-rf", str(private)], check=False)
