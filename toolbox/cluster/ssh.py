"""The OpenSSH client, as the user has it set up: their keys, agent, ~/.ssh/config and known_hosts.

Host keys are always verified: we pass StrictHostKeyChecking=yes and BatchMode=yes, so an
unknown or changed key stops the run instead of prompting or being accepted.
"""

from __future__ import annotations

import re
import shlex
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from toolbox.cluster.hosts import Host
from toolbox.errors import ToolError, UserError

# Options that would switch host-key verification off; refused even when given explicitly.
_UNSAFE = {
    "stricthostkeychecking": {"no", "off", "false"},
    "userknownhostsfile": {"/dev/null"},
}

# Runs the node command with the environment it reads from stdin (NAME=value lines up to a
# lone "."), so secrets never appear on a command line. With "watch", the command runs in a
# session of its own and is stopped as soon as stdin closes or goes quiet for $2 seconds (the
# launcher writes a heartbeat line every few seconds; a cut link or a dead launcher stops it):
# TERM, then KILL after the grace period ($3 s), to the process group and to every process
# whose environment carries this node's TOOLBOX_NODE_ID, since torchrun starts its workers in
# sessions of their own and its agent outlives TERM while it waits in a barrier. Whatever ends
# the command, nothing it started is left behind: the wrapper exits only once all are gone.
NODE_WRAPPER = r"""
watch=$1 quiet=$2 grace=$3; shift 3
while IFS= read -r __tb_line; do
  [ "$__tb_line" = "." ] && break
  export "$__tb_line"
done
unset __tb_line
if [ -n "${TOOLBOX_PATH_PREFIX:-}" ]; then PATH="$TOOLBOX_PATH_PREFIX:$PATH"; export PATH; fi
if [ -n "${TOOLBOX_WORKDIR:-}" ]; then cd "$TOOLBOX_WORKDIR" || exit 126; fi
if [ "$watch" != watch ]; then exec "$@" </dev/null; fi
tag="TOOLBOX_NODE_ID=${TOOLBOX_NODE_ID:-wrapper-$$}"
export "$tag"
exec 3<&0
setsid "$@" </dev/null &
pid=$!
unset TOOLBOX_NODE_ID  # from here on, only what the command started carries the tag
if printf 'a\0' | grep -qzxF a 2>/dev/null; then
  tagged() { grep -lsxzF "$tag" /proc/[0-9]*/environ | sed 's|^/proc/\([0-9]*\)/.*|\1|'; }
else
  tagged() { for f in /proc/[0-9]*/environ; do
    tr '\0' '\n' <"$f" 2>/dev/null | grep -qxF "$tag" && { f=${f#/proc/}; echo "${f%/environ}"; }
  done; }
fi
signal_all() { kill "-$1" -"$pid" 2>/dev/null; for p in $(tagged); do kill "-$1" "$p" 2>/dev/null; done; }
stop_all() {
  signal_all TERM
  [ -n "$(tagged)" ] || return 0
  # A container's PID 1 ignores TERM without a handler; podman stop KILLs it after the grace.
  if [ -n "${TOOLBOX_CONTAINER:-}" ]; then podman stop -t "$grace" "$TOOLBOX_CONTAINER" >/dev/null 2>&1 & fi
  i=0
  while [ -n "$(tagged)" ] && [ "$i" -lt "$((grace * 5))" ]; do sleep 0.2; i=$((i + 1)); done
  i=0
  while [ -n "$(tagged)" ] && [ "$i" -lt 50 ]; do signal_all KILL; sleep 0.2; i=$((i + 1)); done
}
(
  trap 'kill "$r" 2>/dev/null; exit 0' TERM
  if command -v timeout >/dev/null 2>&1; then
    while :; do timeout "$quiet" sh -c 'IFS= read -r _' <&3 & r=$!; wait "$r" || break; done
  else
    while IFS= read -r _; do :; done <&3
  fi
  trap - TERM
  stop_all
) >/dev/null 2>&1 &
watcher=$!
exec 3<&-
wait "$pid"
rc=$?
kill "$watcher" 2>/dev/null
stop_all >/dev/null 2>&1
exit "$rc"
"""
HEARTBEAT_S = 3  # the launcher writes a line this often
QUIET_S = 20  # a node hearing nothing for this long stops (the link or the launcher is gone)
STOP_GRACE_S = 5  # TERM, then KILL after this many seconds

_SECRET_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def env_preamble(env: dict[str, str]) -> bytes:
    lines = []
    for name, value in env.items():
        if not _SECRET_NAME.match(name):
            raise UserError(f"environment variable name {name!r} is not valid")
        if "\n" in value or "\r" in value or "\0" in value:
            raise UserError(f"environment variable {name} holds a line break; cannot forward it")
        lines.append(f"{name}={value}")
    lines.append(".")
    return ("\n".join(lines) + "\n").encode()


@dataclass
class SshClient:
    config: Path | None = None
    options: list[str] = field(default_factory=list)
    connect_timeout: int = 10

    def __post_init__(self) -> None:
        for opt in self.options:
            key, sep, value = opt.partition("=")
            if not sep or not key:
                raise UserError(f"--ssh-option {opt!r}: expected Key=Value")
            if value.strip().lower() in _UNSAFE.get(key.strip().lower(), ()):
                raise UserError(f"--ssh-option {opt}: refused, host keys are always verified")
        if self.config is not None and not self.config.is_file():
            raise UserError(f"--ssh-config {self.config}: no such file")

    def argv(self, host: Host, remote: list[str]) -> list[str]:
        args = ["ssh"]
        if self.config is not None:
            args += ["-F", str(self.config)]
        args += [
            "-o", "BatchMode=yes",
            "-o", "StrictHostKeyChecking=yes",
            "-o", f"ConnectTimeout={self.connect_timeout}",
            # A dead peer must end the run, not hang it.
            "-o", "ServerAliveInterval=5",
            "-o", "ServerAliveCountMax=3",
            "-T",
        ]
        for opt in self.options:
            args += ["-o", opt]
        # ssh joins the remote words with spaces and hands them to the login shell.
        return args + host.ssh_target() + [shlex.join(remote)]

    def wrapped(self, host: Host, command: list[str], watch: bool = True) -> list[str]:
        return self.argv(host, ["sh", "-c", NODE_WRAPPER, "toolbox-node", "watch" if watch else "once",
                                str(QUIET_S), str(STOP_GRACE_S), *command])

    def run(self, host: Host, remote: list[str], env: dict[str, str] | None = None,
            timeout: float = 60) -> subprocess.CompletedProcess:
        """Run a short command (probes); raises ToolError on SSH failures."""
        argv = self.wrapped(host, remote, watch=False) if env is not None else self.argv(host, remote)
        try:
            proc = subprocess.run(argv, input=env_preamble(env) if env is not None else b"",
                                  capture_output=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            raise ToolError(f"{host.destination}: no answer over SSH within {timeout:.0f} s") from None
        except FileNotFoundError:
            raise ToolError("the OpenSSH client `ssh` is not installed") from None
        if proc.returncode == 255:
            stderr = proc.stderr.decode(errors="replace")
            raise ToolError(explain_ssh_failure(host, stderr, self.known_hosts_files(host)))
        return proc

    def known_hosts_files(self, host: Host) -> list[str]:
        """The known_hosts files ssh reads for this host, as `ssh -G` resolves them."""
        argv = self.argv(host, [])[:-1]
        argv.insert(1, "-G")
        try:
            out = subprocess.run(argv, capture_output=True, text=True, timeout=10).stdout
        except (OSError, subprocess.TimeoutExpired):
            return []
        files: list[str] = []
        for line in out.splitlines():
            key, _, value = line.partition(" ")
            if key in ("userknownhostsfile", "globalknownhostsfile"):
                files += value.split()
        return files


def explain_ssh_failure(host: Host, stderr: str, known_hosts: list[str] | None = None) -> str:
    """Turn OpenSSH's stderr into one message that says what is wrong and what to do.

    `known_hosts`: the files ssh searched (user's first), to name where a key belongs."""
    name = host.destination
    tail = stderr.strip().splitlines()[-1] if stderr.strip() else "exit code 255"
    if "REMOTE HOST IDENTIFICATION HAS CHANGED" in stderr:
        fp = re.search(r"(SHA256:[A-Za-z0-9+/=]+)", stderr)
        offending = re.search(r"Offending \S+ key in (\S+)", stderr)
        named = re.search(r"Host key for (\S+) has changed", stderr)
        return (
            f"{name}: host key mismatch, refusing to connect: the key the server presented"
            f"{' (' + fp.group(1) + ')' if fp else ''} differs from the one recorded in"
            f" {offending.group(1) if offending else 'known_hosts'}. This may be a"
            f" man-in-the-middle; if the host was really reinstalled, check the new key's"
            f" fingerprint out of band, then `ssh-keygen -R {named.group(1) if named else host.host}` and connect once by hand."
        )
    if "Host key verification failed" in stderr or "No " in stderr and "host key is known" in stderr:
        unknown = re.search(r"No (\S+) host key is known for (\S+?) and", stderr)
        kind, key_host = (unknown.group(1).lower(), unknown.group(2)) if unknown else ("", host.host)
        files = [f for f in (known_hosts or []) if f != "/dev/null"]
        where = files[0] if files else "~/.ssh/known_hosts"
        searched = f" (searched {', '.join(files)})" if len(files) > 1 else ""
        bracketed = re.match(r"^\[(.+)\]:(\d+)$", key_host)  # known_hosts' form of a non-22 port
        bare, port = bracketed.groups() if bracketed else (key_host, "22")
        scan = f"ssh-keyscan -p {port}{' -t ' + kind if kind else ''} {bare}"
        return (
            f"{name}: host key not in known_hosts, refusing to connect: no line for {key_host}"
            f"{' (' + kind.upper() + ' key)' if kind else ''} in {where}{searched}. Check the host's"
            f" fingerprint out of band (`{scan} | ssh-keygen -lf -`), then add its line to {where}"
            f" (`{scan} >> {where}`), or connect once with `ssh {host.host}` and accept it; then retry."
        )
    if "Permission denied" in stderr:
        return f"{name}: SSH authentication failed ({tail}); check your key/agent and the user name"
    if "Could not resolve hostname" in stderr:
        return f"{name}: unknown host name ({tail})"
    if any(s in stderr for s in ("Connection refused", "timed out", "No route to host", "Network is unreachable")):
        return f"{name}: SSH unreachable ({tail})"
    return f"{name}: ssh failed: {tail}"
