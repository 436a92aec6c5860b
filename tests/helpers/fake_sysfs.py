"""A fake /sys/class/infiniband tree (there is no RDMA NIC on the test machines), laid out as
the kernel's: ports/N/{state,link_layer,gids/I,gid_attrs/ndevs/I,gid_attrs/types/I}, with
unused GID slots all zero. Point TOOLBOX_SYSFS_ROOT at the returned root."""

from __future__ import annotations

import ipaddress
from pathlib import Path

EMPTY = "0000:0000:0000:0000:0000:0000:0000:0000"


def gid_of(ipv4: str) -> str:
    packed = ipaddress.IPv6Address(f"::ffff:{ipv4}").exploded
    return packed


def add_port(root: Path, device: str, port: int, *, state: str = "4: ACTIVE", link_layer: str = "Ethernet",
             gids: dict[int, tuple[str, str, str]] | None = None, slots: int = 8) -> None:
    """gids: {index: (gid, ndev, type)}; other slots stay empty (all-zero GID, no attrs)."""
    p = root / "sys" / "class" / "infiniband" / device / "ports" / str(port)
    for d in ("gids", "gid_attrs/ndevs", "gid_attrs/types"):
        (p / d).mkdir(parents=True, exist_ok=True)
    (p / "state").write_text(state + "\n")
    (p / "link_layer").write_text(link_layer + "\n")
    for i in range(slots):
        gid, ndev, typ = (gids or {}).get(i, (EMPTY, None, None))
        (p / "gids" / str(i)).write_text(gid + "\n")
        if ndev is not None:
            (p / "gid_attrs" / "ndevs" / str(i)).write_text(ndev + "\n")
            (p / "gid_attrs" / "types" / str(i)).write_text(typ + "\n")


def irdma(root: Path, ifname: str, ipv4: str, device: str = "irdma0") -> None:
    """An Intel E810 (irdma) port: RoCE v2 only, link-local GID 0 and the IPv4 one at 1."""
    add_port(root, device, 1, gids={0: ("fe80:0000:0000:0000:b696:91ff:fe12:3456", ifname, "RoCE v2"),
                                    1: (gid_of(ipv4), ifname, "RoCE v2")})


def mlx5(root: Path, ifname: str, ipv4: str, device: str = "mlx5_0") -> None:
    """A ConnectX (mlx5) port: a RoCE v1 and a v2 entry per address, the IPv4 v2 one at 3."""
    ll = "fe80:0000:0000:0000:0e42:a1ff:fe00:0001"
    add_port(root, device, 1, gids={0: (ll, ifname, "IB/RoCE v1"), 1: (ll, ifname, "RoCE v2"),
                                    2: (gid_of(ipv4), ifname, "IB/RoCE v1"), 3: (gid_of(ipv4), ifname, "RoCE v2")})
