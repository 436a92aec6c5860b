"""Two test hosts on one machine: network namespaces joined by a veth pair, an sshd in each.

Addresses exist only inside the namespaces, so no traffic leaves them. Host and user keys,
known_hosts and an ssh_config are written to a temp dir; the filesystem is shared, so the
same checkout and .venv serve both "hosts".
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

SUBNET = "10.231.0"


def sh(*argv: str, check: bool = True, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(argv, check=check, capture_output=True, text=True, **kw)


def available() -> str | None:
    """Why the harness cannot run here, or None."""
    if os.geteuid() != 0:
        return "needs root for ip netns"
    for tool in ("ip", "nsenter", "ssh", "ssh-keygen"):
        if not shutil.which(tool):
            return f"{tool} not installed"
    if not Path("/usr/sbin/sshd").exists():
        return "openssh-server not installed"
    return None


def require(what: str) -> None:
    """Skip the test where the harness cannot run; in CI, fail instead (a skip would hide it)."""
    import pytest

    why = available()
    if why:
        if os.environ.get("CI"):
            raise RuntimeError(f"{what} tests cannot run in CI: {why}")
        pytest.skip(why)


@dataclass
class Node:
    name: str  # ssh alias, e.g. node1
    netns: str
    addr: str
    ifname: str
    sshd_pid: int | None = None


@dataclass
class TwoHosts:
    root: Path
    nodes: list[Node] = field(default_factory=list)

    @property
    def ssh_config(self) -> Path:
        return self.root / "ssh_config"

    @property
    def known_hosts(self) -> Path:
        return self.root / "known_hosts"

    def exec_argv(self, node: Node, argv: list[str]) -> list[str]:
        return netns_argv(node, argv)

    def ssh(self, node: Node, command: str, timeout: float = 20) -> subprocess.CompletedProcess:
        """Plain ssh from node1's namespace (checks the harness itself)."""
        return sh(*self.exec_argv(self.nodes[0], ["ssh", "-F", str(self.ssh_config), "-o", "BatchMode=yes",
                                                   node.name, command]), check=False, timeout=timeout)

    def write_known_hosts(self, keys: dict[str, Path]) -> None:
        lines = []
        for node in self.nodes:
            pub = keys[node.name].read_text().split()
            lines.append(f"{node.addr} {pub[0]} {pub[1]}")
        self.known_hosts.write_text("\n".join(lines) + "\n")


def netns_argv(node: Node, argv: list[str]) -> list[str]:
    # nsenter joins only the network namespace; `ip netns exec` would also remount /sys, which
    # hides /sys/fs/cgroup from everything started there (runc then cannot create containers).
    return ["nsenter", f"--net=/run/netns/{node.netns}", "--", *argv]


def _wait_port(node: Node, deadline: float) -> None:
    while time.monotonic() < deadline:
        out = sh("ip", "netns", "exec", node.netns, "ss", "-ltnH", check=False)
        if f"{node.addr}:22" in out.stdout:
            return
        time.sleep(0.1)
    raise RuntimeError(f"sshd in {node.netns} did not start listening")


def start(root: Path, tag: str) -> TwoHosts:
    """Create the namespaces, the link, keys and sshds. Call stop() in any case."""
    cluster = TwoHosts(root)
    root.mkdir(parents=True, exist_ok=True)
    root.chmod(0o700)
    sh("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "toolbox-test-user", "-f", str(root / "id_ed25519"))
    (root / "authorized_keys").write_text((root / "id_ed25519.pub").read_text())
    Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # sshd's privilege-separation dir

    host_keys: dict[str, Path] = {}
    for i in (1, 2):
        node = Node(f"node{i}", f"tb{tag}n{i}", f"{SUBNET}.{i}", f"tbv{tag}{i}")
        cluster.nodes.append(node)
    try:
        a, b = cluster.nodes
        for node in cluster.nodes:
            sh("ip", "netns", "add", node.netns)
            sh("ip", "-n", node.netns, "link", "set", "lo", "up")
        sh("ip", "link", "add", a.ifname, "netns", a.netns, "type", "veth", "peer", "name", b.ifname, "netns", b.netns)
        for node in cluster.nodes:
            sh("ip", "-n", node.netns, "addr", "add", f"{node.addr}/24", "dev", node.ifname)
            sh("ip", "-n", node.netns, "link", "set", node.ifname, "up")

        for node in cluster.nodes:
            key = root / f"host_{node.name}"
            sh("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", node.name, "-f", str(key))
            host_keys[node.name] = key.with_suffix(".pub")
            conf = root / f"sshd_{node.name}.conf"
            conf.write_text(
                f"ListenAddress {node.addr}:22\n"
                f"HostKey {key}\n"
                f"PidFile {root}/sshd_{node.name}.pid\n"
                f"AuthorizedKeysFile {root}/authorized_keys\n"
                "PermitRootLogin prohibit-password\n"
                "PasswordAuthentication no\nKbdInteractiveAuthentication no\n"
                "UsePAM no\nStrictModes no\nPrintMotd no\nLogLevel ERROR\n"
                "MaxStartups 50\nMaxSessions 50\n"
            )
            spawn_sshd(root, node)
        deadline = time.monotonic() + 15
        for node in cluster.nodes:
            _wait_port(node, deadline)

        cluster.write_known_hosts(host_keys)
        cluster.ssh_config.write_text(
            "".join(f"Host {n.name}\n  HostName {n.addr}\n" for n in cluster.nodes)
            + "Host *\n"
            "  User root\n"
            f"  IdentityFile {root}/id_ed25519\n"
            "  IdentitiesOnly yes\n"
            f"  UserKnownHostsFile {cluster.known_hosts}\n"
            "  GlobalKnownHostsFile /dev/null\n"
            "  IdentityAgent none\n"
        )
        (root / "host_keys").mkdir()
        for name, pub in host_keys.items():
            shutil.copy(pub, root / "host_keys" / f"{name}.pub")
    except BaseException:
        stop(cluster)
        raise
    return cluster


def spawn_sshd(root: Path, node: Node) -> None:
    proc = subprocess.Popen(netns_argv(node, ["/usr/sbin/sshd", "-D", "-e", "-f", str(root / f"sshd_{node.name}.conf")]),
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=open(root / f"sshd_{node.name}.log", "ab"))
    node.sshd_pid = proc.pid


def sshd_pids(node: Node) -> list[int]:
    """The node's sshd: the listener and each connection's processes."""
    found = []
    for pid in sh("ip", "netns", "pids", node.netns, check=False).stdout.split():
        try:
            if Path(f"/proc/{pid}/comm").read_text().strip().startswith("sshd"):
                found.append(int(pid))
        except OSError:
            pass
    return found


def restart_sshd(cluster: TwoHosts, node: Node) -> None:
    """After a test killed it: start it again and wait until it listens."""
    if node.sshd_pid:
        try:
            os.kill(node.sshd_pid, signal.SIGKILL)
            os.waitpid(node.sshd_pid, 0)
        except (ProcessLookupError, ChildProcessError):
            pass
    spawn_sshd(cluster.root, node)
    _wait_port(node, time.monotonic() + 15)


def stop(cluster: TwoHosts) -> None:
    """Kill everything inside the namespaces (sshd included) and delete them."""
    for node in cluster.nodes:
        pids = sh("ip", "netns", "pids", node.netns, check=False).stdout.split()
        for pid in pids:
            try:
                os.kill(int(pid), signal.SIGKILL)
            except (ProcessLookupError, ValueError):
                pass
        if node.sshd_pid:
            try:
                os.kill(node.sshd_pid, signal.SIGKILL)
                os.waitpid(node.sshd_pid, 0)
            except (ProcessLookupError, ChildProcessError):
                pass
        sh("ip", "netns", "del", node.netns, check=False)
