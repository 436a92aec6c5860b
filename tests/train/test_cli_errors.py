"""Every training CLI (finetune, launch, bench, rccl-check, export-model, evaluate), run as the user runs it: broken
input is one line and exit 2 with nothing written, an unexpected error one line and exit 1
(the traceback only with --debug or TOOLBOX_DEBUG=1), --help works, a closed pipe is quiet."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from toolbox_train.export import evaluate, model as export_model
from toolbox_train.commands import finetune

ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONPATH": f"{ROOT / 'entrypoints'}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
CLIS = {"finetune": "toolbox_train.commands.finetune", "launch": "toolbox_train.commands.launch", "bench": "toolbox_train.bench",
        "rccl-check": "toolbox_train.commands.rccl_check", "export-model": "toolbox_train.export.model",
        "evaluate": "toolbox_train.export.evaluate"}


def _run(name: str, *args: str, cwd: Path | None = None, env: dict | None = None):
    return subprocess.run([sys.executable, "-m", CLIS[name], *args], capture_output=True, text=True,
                          timeout=300, cwd=cwd, env=env or ENV)


def _listing(d: Path) -> list[str]:
    return sorted(str(p.relative_to(d)) for p in d.rglob("*"))


@pytest.mark.parametrize("name", sorted(CLIS))
def test_help(name):
    r = _run(name, "--help")
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("usage:") and "--debug" in r.stdout and "Traceback" not in r.stderr


@pytest.mark.parametrize("name", sorted(CLIS))
def test_usage_error_is_one_line_naming_the_flag(name):
    """argparse's own errors too: one line and exit 2, not the usage text and a line."""
    r = _run(name, "--no-such-flag", "x")
    assert r.returncode == 2, r.stderr
    assert r.stderr.count("\n") == 1 and r.stderr.startswith(f"{name}: error: "), r.stderr
    assert "usage:" not in r.stderr and "Traceback" not in r.stderr


@pytest.mark.parametrize("name,args,expect", [
    ("finetune", ["--config", "missing.yaml"], "missing.yaml: config file not found"),
    ("finetune", ["--config", "."], "config file not found"),
    ("launch", ["--strategy", "ddp"], "expected `-- finetune --config X ...`"),
    ("launch", ["--strategy", "ddp", "--sync", "local-sgd:x", "--", "finetune", "--config", "t.yaml"],
     "--sync 'local-sgd:x': expected every-step or local-sgd:K"),
    ("bench", ["run", "--device", "cpu", "--seq", "0", "--out", "o"], "--seq: must be >= 1"),
    ("bench", ["render", "nope.json", "--out", "o"], "nope.json: cannot read results"),
    ("rccl-check", ["--ops", "bogus", "--json", "r.json"], "--ops: unknown bogus"),
    ("rccl-check", ["--sizes", "12Q"], "size '12Q'"),
    ("export-model", ["--run", "nope", "--to", "merged"], "nope: no such folder"),
    ("evaluate", ["--run", "nope", "--runtime", "hf"], "nope: no such folder"),
])
def test_broken_input_is_one_line_exit_2_nothing_written(tmp_path, name, args, expect):
    r = _run(name, *args, cwd=tmp_path)
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert "Traceback" not in r.stderr and expect in r.stderr, r.stderr
    assert r.stderr.startswith(f"{name}: error: ") and r.stderr.count("\n") == 1, r.stderr
    assert _listing(tmp_path) == []


def test_an_unexpected_error_is_one_line_unless_debugging(monkeypatch, capsys):
    def boom(*a, **kw):
        raise RuntimeError("disk on fire\nsecond line")

    monkeypatch.setattr(finetune, "run", boom)
    monkeypatch.delenv("TOOLBOX_DEBUG", raising=False)
    assert finetune.main(["--config", "x.yaml"]) == 1
    err = capsys.readouterr().err
    assert err == ("finetune: internal error: RuntimeError: disk on fire "
                   "(run with --debug or TOOLBOX_DEBUG=1 for the traceback)\n")
    assert finetune.main(["--config", "x.yaml", "--debug"]) == 1
    assert "Traceback" in capsys.readouterr().err
    monkeypatch.setenv("TOOLBOX_DEBUG", "1")
    assert finetune.main(["--config", "x.yaml"]) == 1
    assert "Traceback" in capsys.readouterr().err


@pytest.mark.parametrize("name,args", [("bench", ["list", "--suite", "all", "--shapes", "llama-1b"]),
                                       *((name, ["--help"]) for name in sorted(CLIS))])
def test_a_reader_that_leaves_early_is_quiet(name, args):
    # `bench list | head -1`: the reader is gone before the output is written (closed here at once).
    env = {k: v for k, v in ENV.items() if k != "PYTHONUNBUFFERED"}  # a shell's buffered stdout
    p = subprocess.Popen([sys.executable, "-m", CLIS[name], *args], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, env=env)
    p.stdout.close()
    err = p.stderr.read().decode()
    assert p.wait(timeout=120) == 0 and err == "", err


@pytest.mark.parametrize("module,prog", [(export_model, "export-model"), (evaluate, "evaluate")])
def test_export_and_evaluate_return_through_the_same_guard(monkeypatch, capsys, module, prog):
    def boom(argv):
        raise RuntimeError("disk on fire\nsecond line")

    monkeypatch.setattr(module, "run", boom)
    monkeypatch.delenv("TOOLBOX_DEBUG", raising=False)
    assert module.main(["--run", "r"]) == 1
    assert capsys.readouterr().err == (f"{prog}: internal error: RuntimeError: disk on fire "
                                       "(run with --debug or TOOLBOX_DEBUG=1 for the traceback)\n")
    assert module.main(["--run", "r", "--debug"]) == 1
    assert "Traceback" in capsys.readouterr().err

    def interrupt(argv):
        raise KeyboardInterrupt

    monkeypatch.setattr(module, "run", interrupt)
    assert module.main(["--run", "r"]) == 130
    assert capsys.readouterr().err.startswith(f"{prog}: interrupted")


@pytest.mark.parametrize("exc, expect", [
    (OSError(28, "No space left on device", "/runs/a/metrics.jsonl"), "/runs/a/metrics.jsonl: No space left on device"),
    (OSError(30, "Read-only file system", "/runs/a"), "/runs/a: Read-only file system"),
    (RuntimeError("Error while serializing: I/O error: No space left on device (os error 28)\nmore"),
     "disk full (No space left on device): RuntimeError: Error while serializing: I/O error: No space left"),
])
def test_a_fault_of_the_machine_is_one_line_and_exit_1_not_an_internal_error(monkeypatch, capsys, exc, expect):
    def fail(*a, **kw):
        raise exc

    monkeypatch.setattr(finetune, "run", fail)
    monkeypatch.delenv("TOOLBOX_DEBUG", raising=False)
    assert finetune.main(["--config", "x.yaml"]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"finetune: error: {expect}") and err.count("\n") == 1, err
    assert finetune.main(["--config", "x.yaml", "--debug"]) == 1
    err = capsys.readouterr().err
    assert "Traceback" in err and err.strip().splitlines()[-1].startswith(f"finetune: error: {expect}"), err
