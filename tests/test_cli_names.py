"""One name per concept in the flags (issue 39): the container engine is `--engine` (run, create,
cluster), torchrun|ray is launch's `--launcher`, finetune's HF/Unsloth stays `backend`, evaluate's
llama|hf is `--runtime` and rccl-check's nccl|gloo is `--dist-backend`. The old names still work,
hidden from --help, each use printing one line that names the new flag; the docs and the code's
own messages use only the new names."""

from __future__ import annotations

import contextlib
import io
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "entrypoints")])}


def _toolbox(args):
    from toolbox.cli import build_parser

    return build_parser(args)


def _module(name):
    return lambda args: __import__(name, fromlist=["build_parser"]).build_parser()


# (parser of, argv with the old flag, dest, value, the one line, the new flag)
RENAMED = [
    (_toolbox, ["create", "--via", "toolbx"], "engine", "toolbx", "toolbox create: --via is now --engine", "--engine"),
    (_toolbox, ["cluster", "launch", "--via=none", "--", "true"], "engine", "none",
     "toolbox cluster launch: --via is now --engine", "--engine"),
    (_toolbox, ["cluster", "check", "--via", "distrobox"], "engine", "distrobox",
     "toolbox cluster check: --via is now --engine", "--engine"),
    (_toolbox, ["cluster", "ray", "up", "--via", "none"], "engine", "none",
     "toolbox cluster ray up: --via is now --engine", "--engine"),
    (_module("toolbox_train.commands.launch"), ["--strategy", "ddp", "--engine", "ray"], "launcher", "ray",
     "launch: --engine is now --launcher", "--launcher"),
    (_module("toolbox_train.export.evaluate"), ["--run", "r", "--backend", "hf"], "runtime", "hf",
     "evaluate: --backend is now --runtime", "--runtime"),
    (_module("toolbox_train.commands.rccl_check"), ["--backend", "gloo"], "dist_backend", "gloo",
     "rccl-check: --backend is now --dist-backend", "--dist-backend"),
]


def _parse(make, argv):
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        ns = make(argv).parse_args(argv)
    return ns, err.getvalue()


@pytest.mark.parametrize("make,argv,dest,value,line,new", RENAMED, ids=lambda v: " ".join(v) if isinstance(v, list) else None)
def test_the_old_flag_still_works_and_names_the_new_one(make, argv, dest, value, line, new):
    ns, err = _parse(make, argv)
    assert getattr(ns, dest) == value
    assert err == line + "\n"
    i = next(i for i, a in enumerate(argv) if a.startswith("--via") or a in ("--engine", "--backend"))
    spelled = argv[i].split("=")[0]
    new_argv = argv[:i] + [new] + argv[i + 1:] if "=" not in argv[i] else argv[:i] + [f"{new}={value}"] + argv[i + 1:]
    ns2, err2 = _parse(make, new_argv)
    assert getattr(ns2, dest) == value and err2 == "", (spelled, err2)


@pytest.mark.parametrize("make,argv,dest,value,line,new", RENAMED, ids=lambda v: " ".join(v) if isinstance(v, list) else None)
def test_the_old_flag_takes_only_the_new_flags_values(make, argv, dest, value, line, new):
    from toolbox.errors import UserError as HostError
    from toolbox_train.contract import UserError

    bad = [("bogus" if a == value else a.replace(f"={value}", "=bogus")) for a in argv]
    with pytest.raises((SystemExit, UserError, HostError)):
        _parse(make, bad)


HELP = [(["-m", "toolbox", "create"], "--engine", "--via"), (["-m", "toolbox", "cluster", "launch"], "--engine", "--via"),
        (["-m", "toolbox", "cluster", "ray", "up"], "--engine", "--via"),
        (["-m", "toolbox_train.commands.launch"], "--launcher", "--engine"),
        (["-m", "toolbox_train.export.evaluate"], "--runtime", "--backend"),
        (["-m", "toolbox_train.commands.rccl_check"], "--dist-backend", "--backend ")]


@pytest.mark.parametrize("cmd,new,old", HELP, ids=lambda v: " ".join(v) if isinstance(v, list) else v)
def test_help_names_the_new_flag_only(cmd, new, old):
    cp = subprocess.run([sys.executable, *cmd, "--help"], capture_output=True, text=True, env=ENV, cwd=ROOT, timeout=120)
    assert cp.returncode == 0, cp.stderr
    assert new in cp.stdout
    assert not re.search(rf"{re.escape(old.strip())}(?![\w-])", cp.stdout), cp.stdout


def test_rccl_check_says_the_new_name_once_not_once_per_rank(tmp_path):
    """rccl-check hands its argv to the ranks it starts: under the new name, so one line in all."""
    cp = subprocess.run([sys.executable, "-m", "toolbox_train.commands.rccl_check", "--cpu", "--nproc", "2",
                         "--backend", "gloo", "--sizes", "4K", "--ops", "all_reduce", "--all-reduce-perf", "off"],
                        capture_output=True, text=True, env=ENV, cwd=tmp_path, timeout=300)
    assert cp.returncode == 0, cp.stderr[-2000:]
    assert "dist-backend=gloo" in cp.stdout
    assert cp.stderr.count("is now --dist-backend") == 1, cp.stderr


def test_create_with_the_old_flag_runs(tmp_path):
    cp = subprocess.run([sys.executable, "-m", "toolbox", "create", "--stack", "cpu", "--via", "distrobox", "--name", "c1",
                         "--dry-run"], capture_output=True, text=True, env=ENV, cwd=tmp_path, timeout=120)
    assert cp.returncode == 0, cp.stderr
    assert cp.stderr == "toolbox create: --via is now --engine\n"
    assert "distrobox create" in cp.stdout


# ---- the docs and the code's messages use the new names only ----

DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), ROOT / "rccl-patches" / "README.md",
        *sorted((ROOT / "docs" / "bench").glob("*.sh")), *sorted((ROOT / "docs" / "bench").glob("*.py"))]
CODE = [p for d in ("toolbox", "entrypoints", "dockerfiles") for p in sorted((ROOT / d).rglob("*"))
        if p.suffix in (".py", ".j2", ".yaml", ".sh") and p.is_file()]
OLD = [
    (re.compile(r"--via(?![\w-])"), "--engine"),
    (re.compile(r"--engine[ =](?:torchrun|ray)\b|--engine torchrun\|ray"), "--launcher"),
    (re.compile(r"--backend(?![\w-])"), "--runtime (evaluate) or --dist-backend (rccl-check)"),
]
SAYS_DEPRECATED = re.compile(r"deprecated|is now --|renamed\(")


def _old_names(files):
    hits = []
    for f in files:
        for n, line in enumerate(f.read_text(encoding="utf-8").splitlines(), 1):
            if SAYS_DEPRECATED.search(line):
                continue
            for rx, new in OLD:
                if rx.search(line):
                    hits.append(f"{f.relative_to(ROOT)}:{n}: {rx.search(line).group(0)} (now {new}): {line.strip()}")
    return hits


def test_docs_use_the_new_flag_names():
    assert not _old_names(DOCS), "\n".join(_old_names(DOCS))


def test_code_messages_use_the_new_flag_names():
    hits = [h for h in _old_names(CODE) if "calibration.py" not in h]  # bench calibration's --backend is HF/Unsloth
    assert not hits, "\n".join(hits)
