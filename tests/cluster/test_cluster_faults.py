"""Faults on a two-host run (netns hosts, real sshd, gloo through launch/finetune): whatever
breaks, every process of the run is gone on both hosts within 30 s, the master port is free,
the right host is named, and the printed `--resume` ends with the weights of a run that was
never interrupted."""

from __future__ import annotations

import os
import re
import time

import pytest

import clusterkit as ck
from clusterkit import toolbox

pytestmark = pytest.mark.slow

# A worker of node rank 1 that exits 1 a moment after training is over (summary written):
# node 0's torchrun agent is then waiting in its exit barrier for an agent that never comes.
EXIT_LATE = """
import atexit, os, time
if os.environ.get("TOOLBOX_NODE_RANK") == "1" and "LOCAL_RANK" in os.environ:
    atexit.register(lambda: (time.sleep(1), os._exit(1)))
"""


def _with_hook(tmp_path, source: str) -> dict:
    d = tmp_path / "hook"
    d.mkdir()
    (d / "sitecustomize.py").write_text(source)
    return {"PYTHONPATH": os.pathsep.join(filter(None, [str(d), os.environ.get("PYTHONPATH")]))}


def test_node_failing_after_training_leaves_nothing_on_the_port(hosts, clean, train_cfg, tmp_path):
    """Defect 1: the master's torchrun agent outlived TERM (it waits in the exit barrier) and was
    orphaned holding the master port, so the printed `--resume` failed at once."""
    out = tmp_path / "out"
    r = toolbox(hosts, "launch", "--strategy", "ddp", "--nproc", "1", "--",
                "finetune", "--config", str(train_cfg), "--set", f"output.dir={out}-{{node_rank}}",
                "--set", "train.max_steps=3", env=_with_hook(tmp_path, EXIT_LATE))
    log = r.stdout + r.stderr
    ended = time.monotonic()
    left, port = ck.wait_all_gone(hosts, within=30)
    assert not left and not port, (f"{time.monotonic() - ended:.0f} s after the launcher ended: processes "
                                   f"{sorted(left)}, port {ck.PORT}: {port}\n{log[-3000:]}")
    assert "is held by PID" not in log, log[-3000:]
    assert (out.with_name("out-0") / "summary.json").is_file()


# At interpreter exit, each rank records whether its process group is still up (the state in
# which gloo's threads can abort the process, defect 2); node rank 1 then dies of SIGABRT,
# as the reported runs did, after its summary was written.
ABORT_LATE = """
import atexit, os
if "LOCAL_RANK" in os.environ and os.environ.get("TOOLBOX_NODE_RANK"):
    def _at_exit():
        import torch.distributed as td
        up = td.is_available() and td.is_initialized()
        with open(os.path.join(%r, "pg-rank" + os.environ["RANK"]), "w") as f:
            f.write("up" if up else "destroyed")
        if os.environ["TOOLBOX_NODE_RANK"] == "1":
            os.abort()
    atexit.register(_at_exit)
"""


def test_finished_run_with_abort_at_exit_is_reported_finished(hosts, clean, train_cfg, tmp_path):
    """Defect 2: a worker aborting at exit after training and summary.json made the launcher
    report FAILED and print a resume line; the process group was never destroyed."""
    out = tmp_path / "out"
    marks = tmp_path / "marks"
    marks.mkdir()
    r = toolbox(hosts, "launch", "--strategy", "ddp", "--nproc", "1", "--",
                "finetune", "--config", str(train_cfg), "--set", f"output.dir={out}-{{node_rank}}",
                "--set", "train.max_steps=3", env=_with_hook(tmp_path, ABORT_LATE % str(marks)))
    log = r.stdout + r.stderr
    assert {f.name: f.read_text() for f in marks.iterdir()} == {"pg-rank0": "destroyed", "pg-rank1": "destroyed"}
    assert r.returncode == 0, log[-3000:]
    assert "cluster: warning: node2 (node rank 1) ended with" in log and "nothing was lost" in log
    assert "cluster: all 2 nodes finished" in log
    assert "cluster: FAILED" not in log and "to resume" not in log
    assert (out.with_name("out-0") / "summary.json").is_file()
    left, port = ck.wait_all_gone(hosts, within=30)
    assert not left and not port


def test_local_sgd_resume_is_exact(hosts, clean, train_cfg, tmp_path):
    """Defect 4: resumed under --sync local-sgd:K, the averaging schedule restarted from the
    resumed step (6, 9 became 7, 10 after a resume at 4), so the weights differed."""
    def run(out, *extra, env=None):
        r = toolbox(hosts, "launch", "--strategy", "ddp", "--nproc", "1", "--sync", "local-sgd:3", *extra, "--",
                    "finetune", "--config", str(train_cfg), "--set", f"output.dir={out}-{{node_rank}}",
                    "--set", "train.max_steps=10", "--set", "output.save_steps=2", env=env)
        assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
        return [int(s) for s in re.findall(r"LocalSGD: averaged at step (\d+)", r.stdout + r.stderr)]

    ref, out = tmp_path / "ref", tmp_path / "out"
    assert run(ref) == [3, 6, 9]
    assert run(out, "--env", "TOOLBOX_STOP_AFTER_STEP", env={"TOOLBOX_STOP_AFTER_STEP": "4"}) == [3]
    assert run(out, "--resume", "--env", "TOOLBOX_STOP_AFTER_STEP", env={"TOOLBOX_STOP_AFTER_STEP": "0"}) == [6, 9]
    assert ck.max_abs_diff(ck.weights(out.with_name("out-0")), ck.weights(ref.with_name("ref-0"))) <= 1e-6


def test_launch_refuses_a_held_master_port_naming_the_pid(hosts, clean, train_cfg, tmp_path):
    import subprocess
    import sys

    holder = subprocess.Popen(hosts.exec_argv(hosts.nodes[0], [
        sys.executable, "-c", "import socket, time; s = socket.socket();"
        " s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1);"  # past runs' TIME_WAIT on the port
        " s.bind(('0.0.0.0', %d)); s.listen(); print('up', flush=True); time.sleep(120)" % ck.PORT]),
        stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "up"
        r = toolbox(hosts, "launch", "--strategy", "ddp", "--nproc", "1", "--", "finetune", "--config",
                    str(train_cfg), "--set", f"output.dir={tmp_path}/out-{{node_rank}}", timeout=120)
    finally:
        holder.kill()
        holder.wait()
    assert r.returncode == 1, r.stdout + r.stderr
    assert f"cannot start: master port {ck.PORT} on node1 is held by PID {holder.pid} " in r.stderr, r.stderr
    assert f"kill {holder.pid}" in r.stderr and "starting" not in r.stdout


def test_a_config_error_on_every_node_exits_2_without_a_resume_hint(hosts, clean, train_cfg, tmp_path):
    """Issue 39: every node refused the config (exit 2, before any step), and the launcher still said
    `to resume from the last checkpoint: ... --resume`, which would be refused the same way."""
    r = toolbox(hosts, "launch", "--strategy", "ddp", "--nproc", "1", "--",
                "finetune", "--config", str(train_cfg), "--set", f"output.dir={tmp_path / 'out'}-{{node_rank}}",
                "--set", "nosuch.key=1")
    log = r.stdout + r.stderr
    assert r.returncode == 2, log[-3000:]
    assert "nosuch: unknown key" in log and "cluster: FAILED" in log
    assert "to resume" not in log, log[-3000:]
