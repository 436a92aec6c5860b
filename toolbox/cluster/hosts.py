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
import stat
from dataclasses import dataclass, field
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
    where: str = field(default="", compare=False)  # "FILE:LINE" or "--hosts", for messages

    def identity(self) -> tuple[str, int]:
        """The machine and sshd this names: `h`, `root@h` and `h:22` are one host (the login
        user does not make another machine; ssh's default port is 22)."""
        name = self.host.strip("[]").lower().rstrip(".")
        try:
            name = ipaddress.ip_address(name).compressed
        except ValueError:
            pass
        return name, self.port or 22

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
    return Host(text, m.group("host"), m.group("user"), port, addr, ifname, where)


MAX_HOSTFILE = 1 << 20  # a host list, not a data file


def read_hostfile(path: Path) -> list[str]:
    """The hostfile's lines; a FIFO, a folder, a huge or a binary file is refused (not read for ever)."""
    try:
        st = path.stat()
    except OSError as exc:
        raise UserError(f"{path}: cannot read hostfile: {exc.strerror}") from None
    if not stat.S_ISREG(st.st_mode):
        raise UserError(f"{path}: the hostfile is not a regular file")
    if st.st_size > MAX_HOSTFILE:
        raise UserError(f"{path}: {st.st_size} bytes is not a hostfile (at most {MAX_HOSTFILE}: one host per line)")
    try:
        data = path.read_bytes()[: MAX_HOSTFILE + 1]
    except OSError as exc:
        raise UserError(f"{path}: cannot read hostfile: {exc.strerror}") from None

    def line_of(offset: int) -> int:
        return data.count(b"\n", 0, offset) + 1

    nul = data.find(b"\0")
    if nul >= 0:
        raise UserError(f"{path}:{line_of(nul)}: NUL byte: the hostfile is binary;"
                        " expected text, one [user@]host[:port] per line")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UserError(f"{path}:{line_of(exc.start)}: not UTF-8 text;"
                        " expected one [user@]host[:port] per line") from None
    # line numbers as an editor counts them: \n only (str.splitlines also splits at \x0c, \u2028 ...)
    return text.replace("\r\n", "\n").split("\n")


def parse_hostfile(path: Path) -> list[Host]:
    lines = read_hostfile(path)
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
    seen: dict[tuple[str, int], Host] = {}
    for h in hosts:
        first = seen.setdefault(h.identity(), h)
        if first is h:
            continue
        if first.destination == h.destination:
            raise UserError(f"{h.where}: host {h.destination!r} is listed twice (also at {first.where}); list each host once")
        raise UserError(f"{h.where}: {h.destination!r} is the same host as {first.destination!r} at {first.where}"
                        " (the login user does not make another host; ssh's port is 22 unless given);"
                        " list each host once")
    return hosts
