"""The RDMA (RoCE/InfiniBand) settings of a multi-node run, each with the reason it is set.

`launch --transport rdma` applies them; `toolbox cluster check` reports, per host, the device,
GID table entry and HCA that `launch` will pick there, from the same sysfs data (read remotely
with SYSFS_PROBE). Stdlib only: the host CLI imports it without torch.

Sources (read 2026-12-03): kyuz0/amd-strix-halo-vllm-toolboxes scripts/cluster_manager.py @
345168f4 and scripts/start_vllm_cluster.py @ 23cb7264 (two Strix Halo nodes over RoCE v2 on Intel
E810/irdma: NCCL_NET_GDR_LEVEL=0, NCCL_IB_GID_INDEX=1 for RoCE and 0 for native IB, one HCA
pinned when several ports are active because a prefix matching more than one device made
ncclCommInitRank fail with "internal error", NCCL_IB_TIMEOUT=23, NCCL_IB_RETRY_CNT=7); NCCL's
environment docs for the `=name:port` exact-match form of NCCL_IB_HCA (RCCL reads the same).
"""

from __future__ import annotations

import ipaddress
import os
from dataclasses import dataclass, field
from pathlib import Path

SYSFS_ROOT_ENV = "TOOLBOX_SYSFS_ROOT"  # tests point it at a fake tree: there is no RDMA NIC here
GPU_ARCH_ENV = "TOOLBOX_GPU_ARCH"
LOCK_FILE = Path("/opt/toolbox/stack.lock.yaml")
EMPTY_GID = "0000:0000:0000:0000:0000:0000:0000:0000"

# The same records as read_ports(), printed by a POSIX shell on a remote host (cluster probe):
#   rdmaport<TAB>DEV PORT STATE LINK_LAYER      rdmagid<TAB>DEV PORT INDEX GID NDEV TYPE...
SYSFS_PROBE = r"""
root=${TOOLBOX_SYSFS_ROOT:-}
for p in "$root"/sys/class/infiniband/*/ports/*; do
  [ -d "$p" ] || continue
  port=${p##*/}; dev=${p%/ports/*}; dev=${dev##*/}
  state=$(cat "$p/state" 2>/dev/null | sed 's/^[0-9]*: *//'); ll=$(cat "$p/link_layer" 2>/dev/null)
  printf 'rdmaport\t%s %s %s %s\n' "$dev" "$port" "${state:-?}" "${ll:-?}"
  for g in "$p"/gids/*; do
    [ -f "$g" ] || continue
    i=${g##*/}; gid=$(cat "$g" 2>/dev/null)
    [ -n "$gid" ] && [ "$gid" != "0000:0000:0000:0000:0000:0000:0000:0000" ] || continue
    nd=$(cat "$p/gid_attrs/ndevs/$i" 2>/dev/null); ty=$(cat "$p/gid_attrs/types/$i" 2>/dev/null)
    printf 'rdmagid\t%s %s %s %s %s %s\n' "$dev" "$port" "$i" "$gid" "${nd:--}" "${ty:--}"
  done
done
"""


@dataclass(frozen=True)
class Gid:
    index: int
    gid: str
    ndev: str  # the net device the entry belongs to, "-" when unknown
    type: str  # "RoCE v2", "IB/RoCE v1", "-"

    @property
    def ipv4(self) -> str | None:
        try:
            addr = ipaddress.IPv6Address(self.gid)
        except ValueError:
            return None
        return str(addr.ipv4_mapped) if addr.ipv4_mapped else None


@dataclass
class Port:
    device: str
    port: int
    state: str  # ACTIVE, DOWN, ...
    link_layer: str  # Ethernet (RoCE) or InfiniBand
    gids: list[Gid] = field(default_factory=list)

    @property
    def hca(self) -> str:
        return f"{self.device}:{self.port}"


@dataclass(frozen=True)
class Setting:
    name: str
    value: str | None  # None: left unset, the reason says why
    reason: str


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:  # unset GID slots answer EINVAL on read
        return None


def read_ports(root: str | None = None) -> list[Port]:
    """Every port under <root>/sys/class/infiniband, with its non-empty GID entries."""
    base = Path(root if root is not None else os.environ.get(SYSFS_ROOT_ENV, "/")) / "sys/class/infiniband"
    ports = []
    for pdir in sorted(base.glob("*/ports/*")):
        if not pdir.name.isdigit():
            continue
        state = (_read(pdir / "state") or "?").split(":")[-1].strip()
        port = Port(pdir.parent.parent.name, int(pdir.name), state, _read(pdir / "link_layer") or "?")
        for g in sorted((pdir / "gids").glob("*"), key=lambda x: int(x.name) if x.name.isdigit() else -1):
            gid = _read(g)
            if not g.name.isdigit() or not gid or gid == EMPTY_GID:
                continue
            port.gids.append(Gid(int(g.name), gid, _read(pdir / "gid_attrs/ndevs" / g.name) or "-",
                                 _read(pdir / "gid_attrs/types" / g.name) or "-"))
        ports.append(port)
    return ports


def parse_probe(lines: list[str]) -> list[Port]:
    """SYSFS_PROBE's output back into Ports (unrelated lines are ignored)."""
    ports: dict[tuple[str, int], Port] = {}
    for line in lines:
        key, _, value = line.partition("\t")
        words = value.split()
        if key == "rdmaport" and len(words) == 4 and words[1].isdigit():
            ports[(words[0], int(words[1]))] = Port(words[0], int(words[1]), words[2], words[3])
        elif key == "rdmagid" and len(words) >= 6 and words[1].isdigit() and words[2].isdigit():
            port = ports.get((words[0], int(words[1])))
            if port is not None:
                port.gids.append(Gid(int(words[2]), words[3], words[4], " ".join(words[5:])))
    return list(ports.values())


@dataclass(frozen=True)
class Choice:
    port: Port
    gid: Gid | None
    why: str


def choose(ports: list[Port], ifname: str | None = None, addr: str | None = None) -> tuple[Choice | None, str]:
    """The one port (and its GID entry) to use: the ACTIVE port whose GID table holds the
    interface's IPv4 address as a RoCE v2 entry, else the only ACTIVE port. (None, why) otherwise."""
    active = [p for p in ports if p.state.upper() == "ACTIVE"]
    if not ports:
        return None, "no RDMA device under /sys/class/infiniband"
    if not active:
        return None, "no ACTIVE RDMA port (" + ", ".join(f"{p.hca} {p.state}" for p in ports) + ")"

    def roce_v2(p: Port) -> list[Gid]:
        return [g for g in p.gids if g.ipv4 and "v2" in g.type.lower()
                and (addr is None or g.ipv4 == addr) and (ifname is None or g.ndev in (ifname, "-"))]

    for p in active:
        if p.link_layer.lower() == "ethernet" and roce_v2(p) and (addr or ifname):
            g = roce_v2(p)[0]
            return Choice(p, g, f"its GID {g.index} is {g.type} for {g.ipv4} on {g.ndev}"), ""
    if len(active) == 1:
        p = active[0]
        if p.link_layer.lower() == "infiniband":
            g = next((g for g in p.gids if g.index == 0), None)
            return Choice(p, g, "the only ACTIVE port; native InfiniBand uses GID 0"), ""
        v2 = [g for g in p.gids if g.ipv4 and "v2" in g.type.lower()]
        g = v2[0] if len(v2) == 1 else None
        return Choice(p, g, "the only ACTIVE port" + (f"; its one RoCE v2 IPv4 GID is {g.index}" if g else "")), ""
    names = ", ".join(p.hca for p in active)
    where = f" {ifname or addr}'s address" if (ifname or addr) else " the cluster interface's address"
    return None, f"several ACTIVE ports ({names}) and none holds{where} as a RoCE v2 GID; set NCCL_IB_HCA"


def detect_gpu_arch() -> str | None:
    """gfx name of this node's GPU: $TOOLBOX_GPU_ARCH, the first visible GPU, or the image's lock."""
    if os.environ.get(GPU_ARCH_ENV):
        return os.environ[GPU_ARCH_ENV]
    try:
        import torch

        if torch.cuda.is_available() and getattr(torch.version, "hip", None):
            return torch.cuda.get_device_properties(0).gcnArchName.split(":")[0]
    except Exception:  # no torch or no GPU here: fall back to the image's pins
        pass
    text = _read(LOCK_FILE)
    for line in (text or "").splitlines():
        key, _, value = line.strip().partition(":")
        if key == "gpu_targets":
            return value.strip().strip("'\"").split(",")[0] or None
    return None


def settings(gpu_arch: str | None, ports: list[Port], ifname: str | None, addr: str | None) -> list[Setting]:
    """The environment `launch --transport rdma` sets, in order, each with why."""
    out = [Setting("NCCL_IB_DISABLE", "0", "use the RDMA (IB verbs) transport")]
    strix = gpu_arch == "gfx1151"
    if strix:
        out.append(Setting("NCCL_NET_GDR_LEVEL", "0",
                           "gfx1151 has no GPUDirect RDMA: the NIC moves data through host memory "
                           "(the Strix Halo two-node RoCE setups set 0)"))
    out += [Setting("NCCL_IB_TIMEOUT", "23", "a longer IB timeout than NCCL's default (Strix Halo RoCE setups)"),
            Setting("NCCL_IB_RETRY_CNT", "7", "more retries than NCCL's default (Strix Halo RoCE setups)")]
    choice, why_not = choose(ports, ifname, addr)
    if choice is not None:
        out.append(Setting("NCCL_IB_HCA", f"={choice.port.hca}",
                           f"exactly one device, port {choice.port.hca} ({choice.why}); a prefix matching "
                           "several devices made ncclCommInitRank fail with internal errors"))
    if choice is not None and choice.gid is not None:
        out.append(Setting("NCCL_IB_GID_INDEX", str(choice.gid.index),
                           f"from {choice.port.hca}'s GID table: entry {choice.gid.index} = {choice.gid.gid} "
                           f"({choice.gid.type}, {choice.gid.ndev})"))
    elif strix:
        out.append(Setting("NCCL_IB_GID_INDEX", "1",
                           f"no GID table entry found ({why_not or 'none is RoCE v2 IPv4'}); 1 is the RoCE v2 "
                           "IPv4 entry on the Strix Halo setups' E810 (irdma: one RoCE v2 entry per address)"))
    else:
        out.append(Setting("NCCL_IB_GID_INDEX", "3",
                           f"no GID table entry found ({why_not or 'none is RoCE v2 IPv4'}); 3 is the RoCE v2 "
                           "IPv4 entry where each address has a v1 and a v2 entry (mlx5)"))
    if choice is None:
        out.append(Setting("NCCL_IB_HCA", None, f"not set: {why_not}"))
    return out
