"""One contract for the host and the image (issue 39): the errors, `Terminated` and the durable
atomic write exist once, in toolbox_train's bottom layer; the host's names are the same objects.
The write's fsyncs are seen: the file's before the rename, the folder's after it."""

from __future__ import annotations

import os
import re
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

import toolbox.errors
import toolbox.files
from toolbox_train import contract, disk

ROOT = Path(__file__).resolve().parents[1]


def test_the_host_and_the_image_share_one_of_each():
    for name in ("UserError", "ToolError", "Terminated"):
        assert getattr(toolbox.errors, name) is getattr(contract, name), name
    assert toolbox.files.write_error is disk.write_error
    # Terminated is a KeyboardInterrupt: a cleanup written for Ctrl-C (the cluster runner stopping
    # its nodes) runs for SIGTERM too; its own exit code is 143, an interrupt's stays 130.
    assert issubclass(contract.Terminated, KeyboardInterrupt) and contract.Terminated.exit_code == 143


def _guarded_sigterm(tmp_path: Path, catch: str) -> subprocess.CompletedProcess:
    """A guarded command that SIGTERMs itself inside `try: ... except <catch>:` cleanup code."""
    script = tmp_path / "cmd.py"
    script.write_text(
        "import os, signal, sys\n"
        "from toolbox_train.contract import run_command\n"
        "def body(argv):\n"
        "    try:\n"
        "        os.kill(os.getpid(), signal.SIGTERM)\n"
        "        signal.pause()\n"
        f"    except {catch}:\n"
        "        print('cleaned up', file=sys.stderr)\n"
        "        raise\n"
        "sys.exit(run_command('cmd', body, []))\n")
    env = {**os.environ, "PYTHONPATH": f"{ROOT}:{ROOT / 'entrypoints'}"}
    return subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=60)


def test_sigterm_runs_the_ctrl_c_cleanup_and_exits_143(tmp_path):
    r = _guarded_sigterm(tmp_path, "KeyboardInterrupt")
    assert r.returncode == 143, r.stderr
    assert r.stderr == "cleaned up\ncmd: terminated (SIGTERM)\n"


@pytest.fixture
def fsyncs(monkeypatch):
    """Every os.fsync and os.replace, in order: ('fsync', 'file'|'dir', name) and ('replace', name)."""
    events: list[tuple] = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd):
        st = os.fstat(fd)
        events.append(("fsync", "dir" if stat.S_ISDIR(st.st_mode) else "file", st.st_ino))
        return real_fsync(fd)

    def replace(src, dst):
        events.append(("replace", os.stat(src).st_ino, Path(dst).name))
        return real_replace(src, dst)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    return events


@pytest.mark.parametrize("write", [disk.atomic_write, toolbox.files.atomic_write], ids=["image", "host"])
def test_a_write_fsyncs_the_file_then_renames_then_fsyncs_the_folder(tmp_path, fsyncs, write):
    target = tmp_path / "out.json"
    target.write_text("old\n")
    write(target, "new\n")
    assert target.read_text() == "new\n" and sorted(p.name for p in tmp_path.iterdir()) == ["out.json"]
    assert [e[:2] for e in fsyncs] == [("fsync", "file"), ("replace", fsyncs[0][2]), ("fsync", "dir")], fsyncs
    assert fsyncs[1][2] == "out.json" and target.stat().st_ino == fsyncs[0][2]  # the synced file is the one renamed
    assert fsyncs[2][2] == tmp_path.stat().st_ino
    assert stat.S_IMODE(target.stat().st_mode) == 0o644  # not mkstemp's 0600


def test_the_kernel_sees_fsync_rename_fsync_of_the_folder(tmp_path):
    """The system calls themselves (strace), not Python's names for them: the temp file synced, renamed
    over the target, then the folder synced."""
    if not shutil.which("strace"):
        pytest.skip("strace is not installed")
    code = f"from pathlib import Path; from toolbox_train.disk import atomic_write; atomic_write(Path({str(tmp_path / 'out.json')!r}), 'x')"
    r = subprocess.run(["strace", "-f", "-y", "-e", "trace=fsync,fdatasync,rename,renameat,renameat2", sys.executable,
                        "-c", code], capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT / "entrypoints")},
                       timeout=60)
    if r.returncode != 0 and "ptrace" in r.stderr.lower():
        pytest.skip(f"strace cannot trace here: {r.stderr.strip()[:200]}")
    calls = [ln for ln in r.stderr.splitlines() if re.match(r"(\[pid +\d+\] )?(fsync|fdatasync|rename)", ln)]
    d = re.escape(str(tmp_path))
    assert len(calls) == 3, r.stderr
    assert re.match(rf"fsync\(\d+<{d}/\.out\.json\.\w+\.tmp>\) += 0", calls[0]), calls
    assert re.match(rf'rename(at2?)?\(.*"{d}/\.out\.json\.\w+\.tmp", .*"{d}/out\.json".*\) += 0', calls[1]), calls
    assert re.match(rf"fsync\(\d+<{d}>\) += 0", calls[2]), calls


def test_the_image_write_follows_links_writes_streams_and_refuses_folders(tmp_path):
    real, link = tmp_path / "real", tmp_path / "link"
    real.write_text("old\n")
    link.symlink_to(real)
    disk.atomic_write(link, "new\n")
    assert link.is_symlink() and real.read_text() == "new\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link", "real"]
    disk.atomic_write(Path("/dev/null"), "x")
    assert Path("/dev/null").is_char_device()
    with pytest.raises(contract.ToolError, match="/dev/full: cannot write: No space left on device"):
        disk.atomic_write(Path("/dev/full"), "x")
    with pytest.raises(contract.UserError, match="is a directory"):
        disk.atomic_write(tmp_path, "x")
    # the image's callers write into folders they have not made yet; the host's --output refuses one
    disk.atomic_write(tmp_path / "a" / "b.txt", "x")
    with pytest.raises(contract.UserError, match="folder .* does not exist"):
        toolbox.files.atomic_write(tmp_path / "c" / "d.txt", "x")


def test_a_failed_write_leaves_the_old_file_and_no_temp_file(tmp_path, monkeypatch):
    target = tmp_path / "summary.json"
    target.write_text("old\n")

    def boom(fd):
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(os, "fsync", boom)
    with pytest.raises(contract.ToolError, match="summary.json: cannot write: Input/output error"):
        disk.write_json(target, {"a": 1})
    assert target.read_text() == "old\n" and [p.name for p in tmp_path.iterdir()] == ["summary.json"]


@pytest.mark.parametrize("text, want", [
    ("https://user:pa55w0rd@mlflow.example:5000/x", "https://user:***@mlflow.example:5000/x"),
    ("--set output.mlflow.tracking_uri=http://u:p@h/: no credentials", "--set output.mlflow.tracking_uri=http://u:***@h/: no credentials"),
    ("a URL without a password: https://user@host/ and https://host/", "a URL without a password: https://user@host/ and https://host/"),
    ("token hf_abcdefSECRET in a message", "token *** in a message"),
])
def test_secrets_are_masked_by_one_rule(monkeypatch, text, want):
    monkeypatch.setenv("HF_TOKEN", "hf_abcdefSECRET")
    assert contract.mask_secrets(text) == want


def test_every_guarded_line_is_masked(capsys, monkeypatch):
    monkeypatch.setenv("WANDB_API_KEY", "wandb-secret-value")

    def body(argv):
        raise RuntimeError("cannot reach https://me:hunter2@mlflow.local/ with key wandb-secret-value")

    assert contract.run_command("cmd", body, []) == 1
    err = capsys.readouterr().err
    assert "hunter2" not in err and "wandb-secret-value" not in err, err
    assert "https://me:***@mlflow.local/ with key ***" in err


def test_the_host_cli_masks_by_the_same_rule(capsys):
    from toolbox import cli

    assert cli.main(["bump", "torch", "--index-url", "ftp://alice:s3cret@h/simple"]) == 2
    err = capsys.readouterr().err
    assert "s3cret" not in err and "'ftp://alice:***@h/simple' is not an http(s):// or file:// URL" in err, err
