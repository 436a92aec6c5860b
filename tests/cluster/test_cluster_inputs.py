"""`toolbox cluster` refuses bad host lists and numbers before it reaches any host (issue 23):
exit 2 and one line naming FILE:LINE or the flag; no SSH is tried (the hosts here do not exist)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from toolbox.cluster.hosts import parse_hostfile, resolve_hosts
from toolbox.errors import UserError

ROOT = Path(__file__).resolve().parents[2]


def toolbox(*args: str) -> subprocess.CompletedProcess:
    # a refusal comes before any SSH; the timeout only keeps a regression (a hang) from
    # stalling the suite
    return subprocess.run([sys.executable, "-m", "toolbox", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)


def assert_refused(r: subprocess.CompletedProcess, *needles: str) -> None:
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert r.stderr.startswith("toolbox: error: ") and r.stderr.count("\n") == 1, r.stderr
    assert "Traceback" not in r.stderr and r.stdout == ""
    for needle in needles:
        assert needle in r.stderr, r.stderr


@pytest.mark.parametrize("data, line, what", [
    (b"node1\nnode2\x00\n", 2, "NUL byte"),
    (b"node1\n\x7fELF\x02\x01\x01\x00\x00", 2, "NUL byte"),
    (b"# hosts\nnode1\n\xff\xfenode2\n", 3, "not UTF-8"),
])
def test_binary_hostfile_is_refused_naming_the_line(tmp_path, data, line, what):
    f = tmp_path / "hosts"
    f.write_bytes(data)
    with pytest.raises(UserError, match=what) as e:
        parse_hostfile(f)
    assert str(e.value).startswith(f"{f}:{line}: ")
    assert_refused(toolbox("cluster", "check", "--hostfile", str(f), "--engine", "none"), f"{f}:{line}: ", what)


def test_hostfile_that_is_not_a_regular_file(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)  # reading it would wait for a writer for ever
    assert_refused(toolbox("cluster", "launch", "--hostfile", str(fifo), "--engine", "none", "--", "true"),
                   f"{fifo}: the hostfile is not a regular file")
    assert_refused(toolbox("cluster", "launch", "--hostfile", str(tmp_path), "--engine", "none", "--", "true"),
                   f"{tmp_path}: the hostfile is not a regular file")
    assert_refused(toolbox("cluster", "launch", "--hostfile", str(tmp_path / "nope"), "--engine", "none", "--", "true"),
                   f"{tmp_path / 'nope'}: cannot read hostfile: No such file or directory")


@pytest.mark.parametrize("first, second", [
    ("node1", "root@node1"),
    ("node1", "node1:22"),
    ("root@node1", "node1:22"),
    ("alice@NODE1:22", "bob@node1"),
    ("[::1]", "[0:0::1]:22"),
])
def test_one_host_written_two_ways_is_a_duplicate(tmp_path, first, second):
    f = tmp_path / "hosts"
    f.write_text(f"# cluster\n{first} addr=10.0.0.1\nnode2\n{second}\n")
    with pytest.raises(UserError) as e:
        resolve_hosts(None, f)
    msg = str(e.value)
    assert msg.startswith(f"{f}:4: {second!r} is the same host as {first!r} at {f}:2"), msg
    assert_refused(toolbox("cluster", "check", "--hostfile", str(f), "--engine", "none"), f"{f}:4:", f"{f}:2")


def test_duplicates_across_hostfile_and_hosts(tmp_path):
    f = tmp_path / "hosts"
    f.write_text("node1\nnode2\n")
    assert_refused(toolbox("cluster", "check", "--hostfile", str(f), "--hosts", "root@node2", "--engine", "none"),
                   "--hosts: 'root@node2' is the same host as 'node2' at", f"{f}:2")
    assert_refused(toolbox("cluster", "check", "--hosts", "a,b,a", "--engine", "none"),
                   "--hosts: host 'a' is listed twice")


def test_other_ports_and_hosts_are_other_hosts(tmp_path):
    # two sshds on one machine (other ports) are two hosts; so are two names
    hosts = resolve_hosts("node1,node1:2222,node2:22,node3", None)
    assert [h.identity() for h in hosts] == [("node1", 22), ("node1", 2222), ("node2", 22), ("node3", 22)]


@pytest.mark.parametrize("args, needle", [
    (["--nproc", "0"], "argument --nproc: expected 1 or more, not 0"),
    (["--nproc", "-2"], "argument --nproc: expected 1 or more, not -2"),
    (["--nproc", "two"], "argument --nproc: expected a whole number of 1 or more, not 'two'"),
    (["--master-port", "0"], "argument --master-port: 0 is not a TCP port (1-65535)"),
    (["--master-port", "65536"], "argument --master-port: 65536 is not a TCP port (1-65535)"),
    (["--master-port", "-1"], "argument --master-port: -1 is not a TCP port"),
    (["--master-port", "http"], "argument --master-port: expected a TCP port (1-65535), not 'http'"),
    (["--sync", "local-sgd:0"], "argument --sync: 'local-sgd:0': expected every-step or local-sgd:K with K >= 1"),
    (["--sync", "sometimes"], "argument --sync: 'sometimes'"),
])
def test_numbers_out_of_range_name_the_flag(args, needle):
    assert_refused(toolbox("cluster", "launch", "--hosts", "a,b", "--engine", "none", *args, "--", "true"), needle)
    assert_refused(toolbox("cluster", "check", "--hosts", "a,b", "--engine", "none", *args), needle)


@pytest.mark.parametrize("args, needle", [
    (["--iters", "0"], "argument --iters: expected 1 or more, not 0"),
    (["--size-mib", "0"], "argument --size-mib: expected a size above 0"),
    (["--size-mib", "nan"], "argument --size-mib: expected a size above 0"),
    (["--size-mib", "inf"], "argument --size-mib: expected a size above 0"),
])
def test_check_numbers(args, needle):
    assert_refused(toolbox("cluster", "check", "--hosts", "a,b", "--engine", "none", *args), needle)


@pytest.mark.parametrize("line", ["node1:0", "node1:65536", "node1:99999"])
def test_ports_in_the_hostfile(tmp_path, line):
    f = tmp_path / "hosts"
    f.write_text(f"node0\n{line}\n")
    assert_refused(toolbox("cluster", "check", "--hostfile", str(f), "--engine", "none"), f"{f}:2: port", "out of range")
