"""Which hosts take part, in rank order: `--hosts a,b` and/or a hostfile.

A hostfile has one host per line, `#` comments, and optional `key=value` words:

    # ssh destination   cluster-side settings
    node1               addr=192.168.100.1 ifname=enp191s0
    alice@node2:2222    addr=192.168.100.2

`addr` is the host's address on the cluster network (default: the address SSH reached),
`ifname` the interface training traffic uses there (default: the one routing to the master).
The first host is the master (node rank 0).
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from pathlib import Path

from toolbox.errors import UserError

_DEST = re.compile(r"^(?:(?P<user>[A-Za-z0-9._-]+)@)?(?P<host>[A-Za-z0-9._-]+|\[[0-9A-Fa-f:.]+\])(?::(?P<port>\d{1,5}))?$")
_IFNAME = re.compile(r"^[A-Za-z0-9._@-]{1,15}$")
_KEYS = {"addr", "ifname"}


@dataclass(frozen=True)
class Host:
    destination: str  # what the user wrote, used in log prefixes
    host: str
    user: str | None = None
    port: int | None = None
    addr: str | None = None
    ifname: str | None = None

    def ssh_target(self) -> list[str]:
        """The ssh arguments that name this host (ssh's own config still applies)."""
        args = ["-p", str(self.port)] if self.port else []
        if self.user:
            args += ["-l", self.user]
        return args + ["--", self.host.strip("[]")]


def parse_destination(text: str, where: str, **extra: str) -> Host:
    m = _DEST.match(text)
    if not m or m.group("host").startswith("-"):
        raise UserError(f"{where}: {text!r} is not a host: expected [user@]host[:port]")
    port = int(m.group("port")) if m.group("port") else None
    if port is not None and not 0 < port < 65536:
        raise UserError(f"{where}: port {port} out of range in {text!r}")
    addr = extra.get("addr")
    if addr is not None:
        try:
            ipaddress.ip_address(addr)
        except ValueError:
            raise UserError(f"{where}: addr={addr!r} is not an IP address") from None
    ifname = extra.get("ifname")
    if ifname is not None and not _IFNAME.match(ifname):
        raise UserError(f"{where}: ifname={ifname!r} is not an interface name")
    return Host(text, m.group("host"), m.group("user"), port, addr, ifname)


def parse_hostfile(path: Path) -> list[Host]:
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise UserError(f"{path}: cannot read hostfile: {exc.strerror}") from None
    hosts = []
    for n, raw in enumerate(lines, 1):
        words = raw.split("#", 1)[0].split()
        if not words:
            continue
        where = f"{path}:{n}"
        extra: dict[str, str] = {}
        for word in words[1:]:
            key, sep, value = word.partition("=")
            if not sep or key not in _KEYS or not value:
                raise UserError(f"{where}: unknown setting {word!r} (known: {', '.join(sorted(_KEYS))}, as key=value)")
            extra[key] = value
        hosts.append(parse_destination(words[0], where, **extra))
    return hosts


def resolve_hosts(hosts_arg: str | None, hostfile: Path | None) -> list[Host]:
    hosts: list[Host] = []
    if hostfile is not None:
        hosts += parse_hostfile(hostfile)
    if hosts_arg:
        for item in hosts_arg.split(","):
            if not item.strip():
                raise UserError(f"--hosts: empty entry in {hosts_arg!r}")
            hosts.append(parse_destination(item.strip(), "--hosts"))
    if not hosts:
        raise UserError("no hosts: give --hosts h1,h2 or --hostfile FILE")
    seen: set[str] = set()
    for h in hosts:
        if h.destination in seen:
            raise UserError(f"host {h.destination!r} is listed twice")
        seen.add(h.destination)
    return hosts
