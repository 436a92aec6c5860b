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
# lone "."), so secrets never appear on a command line; the command runs in its own session
# and, with "watch", is stopped (TERM, then KILL after 5 s) as soon as stdin closes, which is
# how the launcher stops a node: closing the pipe, or the SSH connection dropping.
NODE_WRAPPER = r"""
watch=$1; shift
while IFS= read -r __tb_line; do
  [ "$__tb_line" = "." ] && break
  export "$__tb_line"
done
unset __tb_line
if [ -n "${TOOLBOX_PATH_PREFIX:-}" ]; then PATH="$TOOLBOX_PATH_PREFIX:$PATH"; export PATH; fi
if [ -n "${TOOLBOX_WORKDIR:-}" ]; then cd "$TOOLBOX_WORKDIR" || exit 126; fi
if [ "$watch" != watch ]; then exec "$@" </dev/null; fi
exec 3<&0
setsid "$@" </dev/null &
pid=$!
(
  while IFS= read -r _; do :; done <&3
  # A container's PID 1 ignores TERM without a handler; podman stop KILLs it after 5 s.
  if [ -n "${TOOLBOX_CONTAINER:-}" ]; then podman stop -t 5 "$TOOLBOX_CONTAINER" & fi
  kill -TERM -"$pid" 2>/dev/null || exit 0
  sleep 5
  kill -KILL -"$pid" 2>/dev/null
) >/dev/null 2>&1 &
watcher=$!
exec 3<&-
wait "$pid"
rc=$?
kill "$watcher" 2>/dev/null
exit "$rc"
"""

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
        return self.argv(host, ["sh", "-c", NODE_WRAPPER, "toolbox-node", "watch" if watch else "once", *command])

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
            raise ToolError(explain_ssh_failure(host, proc.stderr.decode(errors="replace")))
        return proc


def explain_ssh_failure(host: Host, stderr: str) -> str:
    """Turn OpenSSH's stderr into one message that says what is wrong and what to do."""
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
        return (
            f"{name}: host key not in known_hosts, refusing to connect. Check the host's"
            f" fingerprint and record it (e.g. connect once with `ssh {host.host}`), then retry."
        )
    if "Permission denied" in stderr:
        return f"{name}: SSH authentication failed ({tail}); check your key/agent and the user name"
    if "Could not resolve hostname" in stderr:
        return f"{name}: unknown host name ({tail})"
    if any(s in stderr for s in ("Connection refused", "timed out", "No route to host", "Network is unreachable")):
        return f"{name}: SSH unreachable ({tail})"
    return f"{name}: ssh failed: {tail}"
