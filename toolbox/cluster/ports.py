"""Who listens on the master port of a host: checked before a run starts (a leftover of an
earlier run would make torchrun fail at once) and after a run is stopped (before the launcher
prints the `--resume` line, which would fail the same way)."""

from __future__ import annotations

import time

from toolbox.cluster.hosts import Host
from toolbox.cluster.ssh import SshClient
from toolbox.errors import ToolError

# $1 = port. Prints "listen" when a socket listens on it (in the host's network namespace),
# then "pid PID COMMAND" for each process holding that socket (those we may look at).
# Only awk and find: no ss/lsof needed on the host.
HOLDER_SCRIPT = r"""
hex=$(printf '%04X' "$1")
inodes=$(awk -v h=":$hex" 'FNR > 1 && $4 == "0A" && substr($2, length($2) - 4) == h { print $10 }' \
  /proc/net/tcp /proc/net/tcp6 2>/dev/null)
[ -n "$inodes" ] || exit 0
echo listen
for i in $inodes; do
  find /proc/[0-9]*/fd -maxdepth 1 -lname "socket:\[$i\]" 2>/dev/null
done | sed 's|^/proc/\([0-9]*\)/.*|\1|' | sort -un | while read -r p; do
  echo "pid $p $(tr '\0' ' ' </proc/"$p"/cmdline 2>/dev/null | cut -c1-160)"
done
"""


def holders(ssh: SshClient, host: Host, port: int) -> list[str] | None:
    """None when the port is free; else "PID COMMAND" of each holder ("" entries when unknown)."""
    proc = ssh.run(host, ["sh", "-c", HOLDER_SCRIPT, "toolbox-port", str(port)], timeout=30)
    lines = proc.stdout.decode(errors="replace").splitlines()
    if "listen" not in lines:
        return None
    return [ln[4:].strip() for ln in lines if ln.startswith("pid ")] or [""]


def describe(host: Host, port: int, who: list[str]) -> str:
    named = [w for w in who if w]
    if not named:
        return f"port {port} on {host.destination} is held by a process we cannot see (another user's?)"
    pids = " ".join(w.split()[0] for w in named)
    return (f"port {port} on {host.destination} is held by PID {'; PID '.join(named)}; stop it"
            f" (`kill {pids}` on {host.destination}) or pick another --master-port")


def wait_free(ssh: SshClient, host: Host, port: int, timeout: float) -> list[str] | None:
    """Poll until the port is free (None), or return its holders after `timeout` s.

    Raises ToolError when the host cannot be asked (e.g. it is unreachable)."""
    deadline = time.monotonic() + timeout
    while True:
        who = holders(ssh, host, port)
        if who is None or time.monotonic() > deadline:
            return who
        time.sleep(1)
