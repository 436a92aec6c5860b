"""Fuzzing `toolbox cluster`'s host lists and numbers (issue 23): generated hostfiles (bytes,
mutated lines, one host written several ways) and `--hosts`/`--nproc`/`--master-port` values.

Properties: the host list is either accepted - every host once (by machine and sshd port) - or
refused with UserError naming FILE:LINE or the flag; nothing else escapes. Through the CLI a
refusal is exit 2 and one line. No example reaches SSH: the CLI examples always carry a
duplicate host, so even good numbers end in a refusal before any host is asked.

Bounded budget (CI): TOOLBOX_FUZZ_EXAMPLES (default 150) per property, derandomized unless
TOOLBOX_FUZZ=random.
"""

from __future__ import annotations

import contextlib
import io
import os
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from toolbox import cli
from toolbox.cluster.hosts import resolve_hosts
from toolbox.errors import UserError

EXAMPLES = int(os.environ.get("TOOLBOX_FUZZ_EXAMPLES", "150"))
FUZZ = settings(max_examples=EXAMPLES, deadline=None, database=None,
                derandomize=os.environ.get("TOOLBOX_FUZZ") != "random",
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

names = st.sampled_from(["node1", "node2", "NODE1", "node1.", "10.0.0.1", "[::1]", "[0::1]", "strix-a.lan",
                         "-oProxyCommand=x", "a b", "", "node_3", "x" * 300, "ü", "[zz]"])
users = st.sampled_from(["", "root@", "alice@", "@", "a b@", "bob@"])
ports = st.sampled_from(["", ":22", ":2222", ":0", ":65535", ":65536", ":99999", ":", ":x", ":-1"])
settings_words = st.sampled_from(["", " addr=10.0.0.9", " ifname=eth0", " addr=nope", " slots=4", " addr=",
                                  " ifname=" + "e" * 20, "  # comment", " addr=::1 ifname=enp1s0"])
line = st.builds(lambda u, n, p, s: f"{u}{n}{p}{s}", users, names, ports, settings_words)
lines = st.lists(st.one_of(line, st.sampled_from(["", "# only a comment", "   ", "\t"]), st.text(max_size=20)),
                 max_size=8)


def write(folder: Path, content: bytes) -> Path:
    f = folder / "hosts"
    f.write_bytes(content)
    return f


def check_hosts(hosts_arg: str | None, f: Path | None) -> None:
    try:
        hosts = resolve_hosts(hosts_arg, f)
    except UserError as exc:
        msg = str(exc)
        assert msg.startswith((f"{f}", "--hosts", "no hosts")), msg
        return
    ids = [h.identity() for h in hosts]
    assert len(ids) == len(set(ids)), ids
    assert all(h.port is None or 1 <= h.port <= 65535 for h in hosts)


@FUZZ
@given(text=lines, hosts_arg=st.one_of(st.none(), st.lists(st.builds(lambda u, n, p: f"{u}{n}{p}", users, names, ports),
                                                           max_size=3).map(",".join)),
       newline=st.sampled_from(["\n", "\r\n"]))
def test_generated_hostfiles(text, hosts_arg, newline):
    with tempfile.TemporaryDirectory() as d:
        f = write(Path(d), newline.join(text).encode("utf-8", "surrogatepass"))
        check_hosts(hosts_arg or None, f)


@FUZZ
@given(blob=st.binary(max_size=200), head=lines)
def test_bytes_in_hostfiles(blob, head):
    with tempfile.TemporaryDirectory() as d:
        f = write(Path(d), "\n".join(head).encode("utf-8", "surrogatepass") + blob)
        check_hosts(None, f)


@FUZZ
@given(user1=users, user2=users, port1=st.sampled_from(["", ":22"]), port2=st.sampled_from(["", ":22"]),
       name=st.sampled_from(["node1", "10.0.0.1", "[::1]", "strix.lan"]), gap=lines)
def test_one_host_written_twice_is_always_refused_naming_both_lines(user1, user2, port1, port2, name, gap):
    if "a b@" in (user1, user2) or "@" in (user1, user2):
        return  # not a host at all: refused for that
    gap = [g for g in gap if g.strip() == "" or g.lstrip().startswith("#")]  # no other hosts between
    with tempfile.TemporaryDirectory() as d:
        content = "\n".join([f"{user1}{name}{port1}", *gap, f"{user2}{name.upper()}{port2}"])
        f = write(Path(d), content.encode())
        try:
            resolve_hosts(None, f)
        except UserError as exc:
            assert str(exc).startswith(f"{f}:{len(gap) + 2}: ") and f"{f}:1" in str(exc), str(exc)
        else:
            raise AssertionError(f"accepted {content!r}")


def run_main(argv: list[str]) -> tuple[int, str]:
    err, out = io.StringIO(), io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
        code = cli.main(argv)
    return code, err.getvalue()


numbers = st.one_of(st.integers(-70000, 70000).map(str), st.sampled_from(["", "x", "1.5", "nan", "0x10", " 7", "1e3"]))


@FUZZ
@given(nproc=numbers, port=numbers, iters=numbers, size=numbers, action=st.sampled_from(["launch", "check"]))
def test_cli_numbers_and_a_duplicate_host_exit_2_in_one_line(nproc, port, iters, size, action):
    with tempfile.TemporaryDirectory() as d:
        f = write(Path(d), b"node1\nroot@node1:22\n")  # always refused: no example reaches SSH
        argv = ["cluster", action, "--hostfile", str(f), "--engine", "none", f"--nproc={nproc}", f"--master-port={port}"]
        argv += ["--", "true"] if action == "launch" else [f"--iters={iters}", f"--size-mib={size}"]
        code, err = run_main(argv)
        assert code == 2 and err.startswith("toolbox: error: ") and err.count("\n") == 1, (argv, code, err)
        assert "Traceback" not in err
        assert any(flag in err for flag in ("--nproc", "--master-port", "--iters", "--size-mib", f"{f}:2")), err
