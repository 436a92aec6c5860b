"""The cluster command's pure parts: hosts/hostfile, SSH argv, env forwarding, mismatch table."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from toolbox.cluster.hosts import Host, parse_hostfile, resolve_hosts
from toolbox.cluster.probe import HostInfo, differences, parse_probe
from toolbox.cluster.ssh import SshClient, env_preamble, explain_ssh_failure
from toolbox.errors import ToolError, UserError

ROOT = Path(__file__).resolve().parents[2]


def test_hostfile_then_hosts_in_rank_order(tmp_path):
    f = tmp_path / "hosts"
    f.write_text("# cluster\nnode1 addr=192.168.100.1 ifname=enp191s0\n\nalice@node2:2222  # second\n")
    hosts = resolve_hosts("node3", f)
    assert [h.host for h in hosts] == ["node1", "node2", "node3"]
    assert hosts[0].addr == "192.168.100.1" and hosts[0].ifname == "enp191s0"
    assert hosts[1].ssh_target() == ["-p", "2222", "-l", "alice", "--", "node2"]


@pytest.mark.parametrize("line, needle", [
    ("node1 slots=4", "unknown setting 'slots=4'"),
    ("node1 addr=not-an-ip", "addr='not-an-ip' is not an IP address"),
    ("-oProxyCommand=x", "is not a host"),
    ("node1:99999", "port 99999 out of range"),
])
def test_hostfile_errors_name_file_and_line(tmp_path, line, needle):
    f = tmp_path / "hosts"
    f.write_text(f"node0\n{line}\n")
    with pytest.raises(UserError) as e:
        parse_hostfile(f)
    assert f"{f}:2" in str(e.value) and needle in str(e.value)


def test_duplicate_and_missing_hosts():
    with pytest.raises(UserError, match="listed twice"):
        resolve_hosts("a,b,a", None)
    with pytest.raises(UserError, match="no hosts"):
        resolve_hosts(None, None)


def test_ssh_argv_always_verifies_host_keys(tmp_path):
    cfg = tmp_path / "ssh_config"
    cfg.write_text("Host *\n  StrictHostKeyChecking no\n")
    argv = SshClient(cfg, ["ConnectTimeout=3"]).wrapped(Host("n", "n"), ["launch", "--x"])
    # -o on the command line wins over the config file, so the user's config cannot turn it off.
    assert argv[:3] == ["ssh", "-F", str(cfg)]
    assert "StrictHostKeyChecking=yes" in argv and "BatchMode=yes" in argv
    for bad in ("StrictHostKeyChecking=no", "stricthostkeychecking=off", "UserKnownHostsFile=/dev/null"):
        with pytest.raises(UserError, match="host keys are always verified"):
            SshClient(None, [bad])


def test_refusal_through_the_cli_exits_2():
    r = subprocess.run([sys.executable, "-m", "toolbox", "cluster", "check", "--hosts", "a,b", "--engine", "none",
                        "-o", "StrictHostKeyChecking=no"], capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 2 and "host keys are always verified" in r.stderr


def test_secrets_go_in_the_stdin_preamble_not_argv(monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "hf_sekrit_value")
    from toolbox.cluster.nodecmd import node_env

    info = HostInfo(Host("n", "n", ifname="eth9"))
    env = node_env(info, 1, "run1", "ethernet", [], None, None)
    assert env["HF_TOKEN"] == "hf_sekrit_value" and env["GLOO_SOCKET_IFNAME"] == "eth9"
    argv = SshClient().wrapped(info.host, ["launch", "--node-rank", "1"])
    assert not any("sekrit" in a for a in argv)
    assert b"HF_TOKEN=hf_sekrit_value\n" in env_preamble(env)
    with pytest.raises(UserError, match="line break"):
        env_preamble({"X": "a\nb"})
    with pytest.raises(UserError, match="--env NOPE_NOT_SET"):
        node_env(info, 0, "r", "ethernet", ["NOPE_NOT_SET"], None, None)


def test_probe_parsing_and_difference_table():
    text = ("hostname\th1\nssh\t10.0.0.9 5000 10.0.0.1 22\naddr\tlo 127.0.0.1\naddr\teth0 10.0.0.1\n"
            "mtu\teth0 9000\npython\t3.11.7\npkg\ttorch 2.13.0+cpu\npkg\ttrl 1.15.0\n")
    a = parse_probe(Host("h1", "h1"), text)
    b = parse_probe(Host("h2", "h2"), text.replace("trl 1.15.0", "trl 1.14.0").replace("h1", "h2"))
    assert a.ssh_server_addr == "10.0.0.1" and a.iface_of("10.0.0.1") == "eth0" and a.mtu["eth0"] == 9000
    assert differences([a, b]) == [("package trl", ["1.15.0", "1.14.0"])]

    from rich.console import Console

    from toolbox.cluster.app import _verify_same

    console = Console(record=True, width=120)
    with pytest.raises(ToolError, match="1 difference"):
        _verify_same(console, [a, b], "none", allow=False)
    out = console.export_text()
    assert "package trl" in out and "1.14.0" in out and "h2" in out


def test_image_labels_compared():
    img = 'aa11 sha256:bb {"io.github.toolbox.torch.version":"2.13.0","other":"1"}'
    info = parse_probe(Host("h", "h"), f"image\t{img}\n")
    assert info.software == {"image id": "aa11", "image digest": "sha256:bb", "label torch.version": "2.13.0"}
    bad = parse_probe(Host("h", "h"), "image\tError: nope: image not known\n")
    assert bad.errors and "image not known" in bad.errors[0]


def test_ssh_failure_messages():
    h = Host("node2", "node2")
    changed = ("@@@ WARNING: REMOTE HOST IDENTIFICATION HAS CHANGED! @@@\nThe fingerprint for the ED25519 key sent "
               "by the remote host is\nSHA256:abcDEF.\nOffending ED25519 key in /k/known_hosts:2\n"
               "Host key for 10.0.0.2 has changed and you have requested strict checking.\n"
               "Host key verification failed.\n")
    msg = explain_ssh_failure(h, changed)
    assert "host key mismatch" in msg and "SHA256:abcDEF" in msg and "/k/known_hosts:2" in msg
    assert "ssh-keygen -R 10.0.0.2" in msg
    assert "not in known_hosts" in explain_ssh_failure(h, "No ED25519 host key is known for x\nHost key verification failed.\n")
    assert "authentication failed" in explain_ssh_failure(h, "root@x: Permission denied (publickey).")


def test_podman_node_command_passes_env_by_name_and_devices(monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "hf_x")
    from toolbox.cluster.nodecmd import launch_argv, node_env, wrap_engine

    info = HostInfo(Host("n2", "n2", ifname="enp1"), devices=["/dev/kfd", "/dev/dri", "/dev/infiniband"])
    env = node_env(info, 1, "abcd", "rdma", [], None, "/work/run")
    argv = launch_argv("ddp", 2, 1, "10.0.0.1", 29500, "rdma", None, None, False, ["finetune", "--config", "t.yaml"])
    cmd = wrap_engine("podman", "localhost/toolbox-gfx1151:x", info, env, argv, "rdma", "/work/run")
    assert cmd[:3] == ["podman", "run", "--rm"] and "--network" in cmd and cmd[cmd.index("--network") + 1] == "host"
    assert env["TOOLBOX_CONTAINER"] == "toolbox-abcd-1" and cmd[cmd.index("--name") + 1] == "toolbox-abcd-1"
    for d in ("/dev/kfd", "/dev/dri", "/dev/infiniband"):
        assert d in cmd
    assert "-v" in cmd and "/work/run:/work/run" in cmd
    i = cmd.index("localhost/toolbox-gfx1151:x")
    assert cmd[i + 1:i + 3] == ["launch", "--strategy"] and cmd[-3:] == ["finetune", "--config", "t.yaml"]
    assert "HF_TOKEN" in cmd and "hf_x" not in " ".join(cmd)  # -e NAME: the value stays in the environment
    assert "--node-rank" in cmd and cmd[cmd.index("--node-rank") + 1] == "1"
    assert cmd[cmd.index("--transport") + 1] == "rdma" and "NCCL_IB_DISABLE" not in env  # launch sets the RDMA env


# A process tree like torchrun's: a parent that ignores TERM (the elastic agent blocked in a
# barrier) and a child in a session of its own (torchrun starts workers so) that ignores it too.
_STUBBORN = """
import os, signal, subprocess, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
child = subprocess.Popen([sys.executable, "-c",
    "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"], start_new_session=True)
print(child.pid, flush=True)
time.sleep(600)
"""


def _node_wrapper(quiet: int, grace: int) -> subprocess.Popen:
    from toolbox.cluster.ssh import NODE_WRAPPER

    proc = subprocess.Popen(["sh", "-c", NODE_WRAPPER, "toolbox-node", "watch", str(quiet), str(grace),
                             sys.executable, "-c", _STUBBORN], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    proc.stdin.write(env_preamble({"TOOLBOX_NODE_ID": f"unit-{os.getpid()}-{quiet}"}))
    proc.stdin.flush()
    return proc


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.parametrize("how", ["stdin closed", "launcher silent"])
def test_node_wrapper_stops_what_outlives_term(how):
    """TERM, then KILL after the grace, to the group and to the child in its own session; the
    wrapper exits only when both are gone. Silence (no heartbeat) stops the node like EOF."""
    proc = _node_wrapper(quiet=2 if how == "launcher silent" else 60, grace=1)
    leader = None
    child = int(proc.stdout.readline())
    for p in Path("/proc").iterdir():  # the session leader: the stubborn parent
        if p.name.isdigit() and _alive(int(p.name)):
            try:
                if f"unit-{os.getpid()}" in (p / "environ").read_bytes().decode(errors="replace") \
                        and int(p.name) != child:
                    leader = int(p.name)
            except OSError:
                pass
    assert leader and _alive(child)
    if how == "stdin closed":
        proc.stdin.close()
    proc.wait(timeout=30)
    assert not _alive(leader) and not _alive(child)


def test_unknown_host_key_names_the_file_and_the_line_to_add():
    err = ("No ECDSA host key is known for [10.0.0.2]:2222 and you have requested strict checking.\n"
           "Host key verification failed.\n")
    msg = explain_ssh_failure(Host("gpu2", "gpu2"), err, ["/home/u/.ssh/known_hosts", "/etc/ssh/ssh_known_hosts"])
    assert msg.startswith("gpu2: host key not in known_hosts, refusing to connect: no line for [10.0.0.2]:2222")
    assert "in /home/u/.ssh/known_hosts (searched /home/u/.ssh/known_hosts, /etc/ssh/ssh_known_hosts)" in msg
    assert "`ssh-keyscan -p 2222 -t ecdsa 10.0.0.2 >> /home/u/.ssh/known_hosts`" in msg


@pytest.mark.parametrize("engine, target", [("toolbx", "strix"), ("distrobox", "strix"), ("podman", "localhost/t:x")])
def test_ray_node_setup_crosses_into_the_container_by_file_not_environment(engine, target, monkeypatch, tmp_path):
    """`cluster ray up`: the host writes the token and the node's environment (0600) into the Ray
    folder before the container is entered; neither value is on the command line. The files are
    written and sourced here for real, values with quotes and spaces included."""
    import argparse
    import stat

    from toolbox.cluster.ray_nodes import _node

    monkeypatch.setenv("HF_TOKEN", "hf_it's a \"secret\" $HOME")
    info = HostInfo(Host("n2", "n2", ifname="enp1"), addrs=[("enp1", "10.0.0.2")], devices=["/dev/kfd"])
    args = argparse.Namespace(env=[], remote_path=None, workdir=None, transport="ethernet", cpu=False, num_gpus=1,
                              ray_dir=str(tmp_path / "ray-{node_rank}"), port=6379, engine=engine)
    argv, env = _node(args, info, 1, "10.0.0.1:6379", "t0ken" * 8, target)
    joined = " ".join(argv)
    assert "t0ken" not in joined and "secret" not in joined and env["RAY_AUTH_TOKEN"] == "t0ken" * 8
    assert argv[:2] == ["sh", "-c"] and argv[4] == str(tmp_path / "ray-1")  # PREP on the host, then the node
    node = argv[5:]
    if engine == "podman":
        assert "podman run -d" in node[2] and "toolbox-ray-6379-n2" in node and "/dev/kfd" in node
    else:
        assert node[:3] == (["toolbox", "run", "--container", "strix"] if engine == "toolbx"
                            else ["distrobox", "enter", "strix", "--"])[:3]
    # PREP for real, its last step replaced by a shell that reads what the node would source.
    prep = argv[:5] + ["sh", "-c", '. "$1/node.env"; printf "%s|%s|%s" "$HF_TOKEN" "$GLOO_SOCKET_IFNAME" '
                       '"${RAY_AUTH_TOKEN:-unset}"', "x", argv[4]]
    out = subprocess.run(prep, env={"PATH": os.environ["PATH"], **env}, capture_output=True, text=True, check=True)
    assert out.stdout == "hf_it's a \"secret\" $HOME|enp1|unset"
    for name in ("auth_token", "node.env"):
        f = tmp_path / "ray-1" / name
        assert stat.S_IMODE(f.stat().st_mode) == 0o600
    assert (tmp_path / "ray-1" / "auth_token").read_text() == "t0ken" * 8


def test_a_usage_error_on_every_failed_node_gets_no_resume_hint():
    from toolbox.cluster.runner import NodeJob, Outcome

    def job(rank, code):
        return NodeJob(Host(f"node{rank}", f"node{rank}"), rank, ["true"], {}, returncode=code)

    bad_config = [job(0, 2), job(1, 2)]
    assert Outcome(2, bad_config, False, []).usage_error
    assert Outcome(2, bad_config[:1], False, [job(1, -15)]).usage_error  # the other node stopped by us
    assert not Outcome(1, [job(0, 2), job(1, 1)], False, []).usage_error  # a fault on one node: resumable
    assert not Outcome(1, [job(0, 1)], False, []).usage_error
    assert not Outcome(130, [], True, bad_config).usage_error  # interrupted: resume
    assert not Outcome(0, [], False, []).usage_error
