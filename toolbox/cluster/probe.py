"""What each host has: addresses, MTUs, the route to the master, devices, and the software
(image id/digest/pins, or package versions with --engine none), gathered over SSH in one call."""

from __future__ import annotations

import ipaddress
import json
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from toolbox.cluster.hosts import Host
from toolbox.cluster.ssh import SshClient
from toolbox.components.labels import LABEL_PREFIX
from toolbox.errors import ToolError, UserError
from toolbox_train.config.rdma import SYSFS_PROBE, Port, parse_probe as parse_rdma

PACKAGES = ("torch", "transformers", "trl", "peft", "accelerate", "datasets", "safetensors",
            "toolbox-train", "strix-toolbox", "unsloth", "bitsandbytes", "triton", "pytorch-triton-rocm")

_PYPROBE = (
    "import importlib.metadata as m, platform\n"
    "print('python\\t' + platform.python_version())\n"
    f"for n in {PACKAGES!r}:\n"
    "    try: print('pkg\\t%s %s' % (n, m.version(n)))\n"
    "    except m.PackageNotFoundError: print('pkg\\t%s -' % n)\n"
)

# $1 = engine (--engine), $2 = image or container, $3 = master address (may be empty).
PROBE_SCRIPT = r"""
mode=$1 target=$2 master=$3
fmt='{{.Id}} {{.Digest}} {{json .Labels}}'
echo "hostname	$(hostname)"
echo "ssh	${SSH_CONNECTION:-}"
ip -o -4 addr show 2>/dev/null | while read -r _ dev _ cidr _; do echo "addr	$dev ${cidr%/*}"; done
ip -o link show 2>/dev/null | sed -n 's/^[0-9]*: \([^:@]*\)[^ ]*: .* mtu \([0-9]*\).*/mtu	\1 \2/p'
if [ -n "$master" ]; then echo "route	$(ip -o route get "$master" 2>/dev/null)"; fi
for d in /dev/kfd /dev/dri /dev/infiniband /dev/nvidiactl; do [ -e "$d" ] && echo "dev	$d"; done
for r in /sys/class/infiniband/*; do [ -e "$r" ] && echo "rdma	${r##*/}"; done
""" + SYSFS_PROBE + r"""
case "$mode" in
  none) python3 -c "$4" || echo "error	python3 failed on this host" ;;
  podman) podman image inspect --format "$fmt" "$target" 2>&1 | sed 's/^/image	/' ;;
  toolbx|distrobox)
    img=$(podman container inspect --format '{{.Image}}' "$target" 2>&1) || { echo "error	no container $target: $img"; exit 0; }
    podman image inspect --format "$fmt" "$img" 2>&1 | sed 's/^/image	/' ;;
esac
"""


@dataclass
class HostInfo:
    host: Host
    hostname: str = ""
    ssh_server_addr: str | None = None
    addrs: list[tuple[str, str]] = field(default_factory=list)  # (ifname, ipv4)
    mtu: dict[str, int] = field(default_factory=dict)
    route_dev: str | None = None
    devices: list[str] = field(default_factory=list)
    rdma: list[str] = field(default_factory=list)
    rdma_ports: list[Port] = field(default_factory=list)  # ports and GID tables, as `launch` reads them
    software: dict[str, str] = field(default_factory=dict)  # what must match across hosts
    errors: list[str] = field(default_factory=list)

    def iface_of(self, addr: str) -> str | None:
        return next((dev for dev, a in self.addrs if a == addr), None)

    def addr_on(self, ifname: str) -> str | None:
        return next((a for dev, a in self.addrs if dev == ifname), None)


def parse_probe(host: Host, text: str) -> HostInfo:
    info = HostInfo(host)
    for line in text.splitlines():
        key, _, value = line.partition("\t")
        if key == "hostname":
            info.hostname = value
        elif key == "ssh" and value.split():
            info.ssh_server_addr = value.split()[2] if len(value.split()) >= 3 else None
        elif key == "addr":
            dev, _, a = value.partition(" ")
            info.addrs.append((dev, a))
        elif key == "mtu":
            dev, _, m = value.partition(" ")
            if m.isdigit():
                info.mtu[dev] = int(m)
        elif key == "route":
            words = value.split()
            if "dev" in words:
                info.route_dev = words[words.index("dev") + 1]
        elif key == "dev":
            info.devices.append(value)
        elif key == "rdma":
            info.rdma.append(value)
        elif key == "python":
            info.software["python"] = value
        elif key == "pkg":
            name, _, version = value.partition(" ")
            info.software[f"package {name}"] = version
        elif key == "image":
            # "<id> <digest> <labels as JSON>" (podman 4.3 ignores a whole-object {{json .}})
            parts = value.split(" ", 2)
            try:
                labels = json.loads(parts[2]) if len(parts) == 3 else None
            except ValueError:
                labels = None
            if labels is not None and not isinstance(labels, dict):
                labels = {}  # an image without labels prints null
            if labels is None or not parts[0]:
                info.errors.append(f"image: {value}")
                continue
            info.software["image id"] = parts[0]
            info.software["image digest"] = parts[1]
            for label, v in sorted(labels.items()):
                if label.startswith(LABEL_PREFIX):
                    info.software[f"label {label.removeprefix(LABEL_PREFIX)}"] = v
        elif key == "error":
            info.errors.append(value)
    info.rdma_ports = parse_rdma(text.splitlines())
    return info


class Prober:
    def __init__(self, ssh: SshClient, engine: str, target: str, base_env: dict[str, str]):
        self.ssh, self.engine, self.target, self.base_env = ssh, engine, target, base_env

    def probe(self, host: Host, master_addr: str = "") -> HostInfo:
        proc = self.ssh.run(host, ["sh", "-c", PROBE_SCRIPT, "probe", self.engine, self.target, master_addr, _PYPROBE],
                            env=dict(self.base_env), timeout=60)
        info = parse_probe(host, proc.stdout.decode(errors="replace"))
        if proc.returncode != 0:
            info.errors.append(f"probe exited {proc.returncode}: {proc.stderr.decode(errors='replace').strip()[-300:]}")
        return info

    def probe_all(self, hosts: list[Host]) -> tuple[list[HostInfo], str]:
        """Probe the master, find its cluster address, then the rest in parallel."""
        master = self.probe(hosts[0])
        addr = master_address(master)
        with ThreadPoolExecutor(max_workers=min(16, len(hosts))) as pool:
            rest = list(pool.map(lambda h: self.probe(h, addr), hosts[1:]))
        infos = [master, *rest]
        for info in infos:
            if info.errors:
                raise ToolError(f"{info.host.destination}: " + "; ".join(info.errors))
        assign_interfaces(infos, addr)
        return infos, addr


def master_address(info: HostInfo) -> str:
    h = info.host
    if h.addr:
        return h.addr
    if h.ifname:
        a = info.addr_on(h.ifname)
        if not a:
            raise UserError(f"{h.destination}: no IPv4 address on interface {h.ifname} (hostfile ifname=)")
        return a
    a = info.ssh_server_addr
    if not a or ipaddress.ip_address(a).is_loopback:
        raise UserError(f"{h.destination}: cannot tell the master's cluster address from SSH ({a or 'none'});"
                        " give it in a hostfile as addr=IP or ifname=IF")
    return a


def assign_interfaces(infos: list[HostInfo], master_addr: str) -> None:
    """Each host's interface for training traffic: given, the master's own, or the route to it."""
    for i, info in enumerate(infos):
        if info.host.ifname:
            continue
        dev = info.iface_of(master_addr) if i == 0 else info.route_dev
        if not dev:
            raise ToolError(f"{info.host.destination}: no route to the master address {master_addr}")
        object.__setattr__(info, "host", _with_ifname(info.host, dev))


def _with_ifname(host: Host, dev: str) -> Host:
    from dataclasses import replace
    return replace(host, ifname=dev)


def differences(infos: list[HostInfo]) -> list[tuple[str, list[str]]]:
    keys = sorted({k for info in infos for k in info.software})
    rows = []
    for k in keys:
        values = [info.software.get(k, "(missing)") for info in infos]
        if len(set(values)) > 1:
            rows.append((k, values))
    return rows
