"""README.md and docs/*.md as a contract (issue 12, item 5; issue 39 moved most of the README's
examples into docs/ pages, which this collects alike).

Every fenced shell example (```bash / ```sh) runs here, in a fresh folder, unless the line
before its fence says why not: `<!-- readme-test: not run: REASON -->` (a GPU, two hosts, the
network, a built image). Those are still checked: every toolbox / finetune / launch / bench /
rccl-check command in them is parsed by that command's own argument parser, so a renamed or
misspelt option in the docs fails here.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SHELL = {"bash", "sh", "shell", "console"}
MARK = re.compile(r"^<!--\s*readme-test:\s*not run:\s*(?P<why>\S.*?)\s*-->$")
# Our console scripts, as `pip install -e .` makes them (the suite may run without that install).
SCRIPTS = {"toolbox": "toolbox", "finetune": "toolbox_train.commands.finetune", "launch": "toolbox_train.commands.launch",
           "bench": "toolbox_train.bench", "rccl-check": "toolbox_train.commands.rccl_check",
           "export-model": "toolbox_train.export.model", "evaluate": "toolbox_train.export.evaluate"}


@dataclass
class Fence:
    file: Path
    line: int
    lang: str
    text: str
    not_run: str | None

    @property
    def id(self) -> str:
        return f"{self.file.relative_to(ROOT)}:{self.line}"


def fences(files=DOCS) -> list[Fence]:
    out = []
    for f in files:
        lines = f.read_text(encoding="utf-8").splitlines()
        i = 0
        while i < len(lines):
            m = re.match(r"^```(\w*)", lines[i])
            if not m:
                i += 1
                continue
            start, lang = i, m.group(1)
            j = i + 1
            while j < len(lines) and not lines[j].startswith("```"):
                j += 1
            prev = next((lines[k].strip() for k in range(start - 1, -1, -1) if lines[k].strip()), "")
            mark = MARK.match(prev)
            out.append(Fence(f, start + 1, lang, "\n".join(lines[start + 1:j]) + "\n",
                             mark.group("why") if mark else None))
            i = j + 1
    return out


SHELL_FENCES = [f for f in fences() if f.lang in SHELL]
RUN = [f for f in SHELL_FENCES if f.not_run is None]
PARSE = [f for f in SHELL_FENCES if f.not_run is not None]


def commands(script: str) -> list[list[str]]:
    """The simple commands of a shell snippet: continuations joined, heredoc bodies and comments
    dropped, split at && || ; | and &, leading VAR=value words removed."""
    text = script.replace("\\\n", " ")
    out, heredoc = [], None
    for line in text.splitlines():
        if heredoc is not None:
            if line.strip() == heredoc:
                heredoc = None
            continue
        m = re.search(r"<<-?\s*'?\"?(\w+)'?\"?", line)
        if m:
            heredoc = m.group(1)
        for part in re.split(r"&&|\|\||;|\||(?<![<>])&(?!>)", line):
            try:
                argv = shlex.split(part, comments=True)
            except ValueError:
                continue
            while argv and re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", argv[0]):
                argv = argv[1:]
            if argv:
                out.append(argv)
    return out


def which_cli(argv: list[str]) -> tuple[str, list[str]] | None:
    """(module, args) when argv runs one of this project's commands, else None."""
    if argv[0] in ("python", "python3") and len(argv) > 2 and argv[1] == "-m":
        mod = argv[2]
        if mod in ("toolbox", *SCRIPTS.values()):
            return mod, argv[3:]
        return None
    if argv[0] == "torchrun" and "-m" in argv:
        i = argv.index("-m")
        return (argv[i + 1], argv[i + 2:]) if argv[i + 1] in SCRIPTS.values() else None
    if argv[0] == "toolbox" and len(argv) > 1 and argv[1] == "enter":
        return None  # Fedora's toolbx (README says so next to it)
    if argv[0] in SCRIPTS:
        return SCRIPTS[argv[0]], argv[1:]
    return None


def parser_for(module: str, args: list[str]) -> argparse.ArgumentParser:
    if module == "toolbox":
        from toolbox.cli import build_parser

        return build_parser(args)
    if module == "toolbox_train.bench":
        from toolbox_train.bench.command import build_parser

        return build_parser()
    mod = __import__(module, fromlist=["build_parser"])
    return mod.build_parser()


def check_parses(module: str, args: list[str]) -> None:
    args = [a for a in args if a != "..."]  # "and the rest" in prose-like examples
    if module == "toolbox_train.commands.launch":
        assert "--" in args, f"launch without `-- finetune ...`: {args}"
        i = args.index("--")
        parse(module, args[:i])
        assert args[i + 1] == "finetune", args
        return parse("toolbox_train.commands.finetune", args[i + 2:])
    if module == "toolbox" and args[:1] == ["run"] and "--" in args:
        parse(module, args[:args.index("--")])  # what follows `--` runs in the image
        rest = args[args.index("--") + 1:]
        hit = which_cli(rest) if rest else None
        return check_parses(*hit) if hit else None
    if module == "toolbox" and args[:2] == ["cluster", "launch"] and "--" in args:
        parse(module, args)
        rest = args[args.index("--") + 1:]
        return parse("toolbox_train.commands.finetune", rest[1:]) if rest[:1] == ["finetune"] else None
    parse(module, args)


def parse(module: str, args: list[str]) -> None:
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            parser_for(module, args).parse_args(args)
        except SystemExit as exc:
            if exc.code not in (0, None):
                pytest.fail(f"{module} {shlex.join(args)}: {err.getvalue().strip()}")


def test_every_shell_fence_runs_or_says_why():
    assert RUN and PARSE
    bare = [f.id for f in fences() if f.lang == "" and re.search(r"^\s*(python3? -m |toolbox |finetune |launch |bench |rccl-check )", f.text, re.M)]
    assert not bare, f"fences without a language that hold commands: {bare} (write ```bash)"


@pytest.mark.parametrize("fence", PARSE, ids=[f.id for f in PARSE])
def test_not_run_examples_parse(fence):
    checked = 0
    for argv in commands(fence.text):
        hit = which_cli(argv)
        if hit:
            check_parses(*hit)
            checked += 1
    assert checked or "make" in fence.text or "git clone" in fence.text, f"{fence.id}: no command checked"


def shim_bin(tmp_path: Path) -> Path:
    """The console scripts, as `python -m` of this checkout (whatever is or is not installed)."""
    b = tmp_path / "bin"
    b.mkdir()
    for name, mod in SCRIPTS.items():
        p = b / name
        p.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m {mod} "$@"\n')
        p.chmod(0o755)
    for name in ("python", "python3"):  # not a symlink: a venv's python finds its venv by its path
        (b / name).write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
        (b / name).chmod(0o755)
    return b


@pytest.mark.parametrize("fence", RUN, ids=[f.id for f in RUN])
def test_runnable_examples_run(fence, tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    (work / "examples").symlink_to(ROOT / "examples")  # the examples run as from a checkout (`examples/...`)
    tmp = tmp_path / "tmp"  # where dry runs leave their context: removed with tmp_path
    tmp.mkdir()
    env = {**os.environ, "PATH": f"{shim_bin(tmp_path)}{os.pathsep}{os.environ['PATH']}", "TMPDIR": str(tmp),
           "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "entrypoints")])}
    cp = subprocess.run(["bash", "-euo", "pipefail", "-c", fence.text], cwd=work, env=env,
                        capture_output=True, text=True, timeout=900)
    assert cp.returncode == 0, f"{fence.id} exited {cp.returncode}\n{fence.text}\n{cp.stdout[-3000:]}\n{cp.stderr[-3000:]}"
    assert "Traceback" not in cp.stderr, cp.stderr[-3000:]


def test_readme_mine_yaml_renders(tmp_path):
    """The docs' own `mine.yaml` (docs/stacks.md) is a stack that loads and renders as written."""
    block = next(f for f in fences() if f.lang == "yaml" and "mine.yaml" in f.text)
    (tmp_path / "mine.yaml").write_text(block.text)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "entrypoints")])}
    cp = subprocess.run([sys.executable, "-m", "toolbox", "render", "--stack", str(tmp_path / "mine.yaml")],
                        capture_output=True, text=True, env=env, cwd=tmp_path)
    assert cp.returncode == 0, cp.stderr


def test_readme_set_examples_respect_the_stated_caps():
    """`--set hf.X=V` on the gfx1151 stack stays within the caps the docs state for it."""
    from packaging.version import Version

    text = "\n".join(f.read_text() for f in DOCS)
    caps = dict((k, Version(v)) for k, v in re.findall(r"caps (?:\w+ at [\d.]+ and )?(\w+) at ([\d.]+)", text))
    caps.update((k, Version(v)) for k, v in re.findall(r"caps (\w+) at ([\d.]+)", text))
    assert {"transformers", "trl"} <= set(caps), caps
    seen = 0
    for f in SHELL_FENCES:
        for argv in commands(f.text):
            hit = which_cli(argv)
            if not hit or hit[0] != "toolbox" or not hit[1] or hit[1][0] not in ("build", "render"):
                continue
            args = hit[1]
            stack = args[args.index("--stack") + 1] if "--stack" in args else "gfx1151"
            if stack != "gfx1151":
                continue
            for k, v in re.findall(r"--set hf\.(\w+)=(\S+)", shlex.join(args)):
                seen += 1
                if k in caps:
                    assert Version(v) <= caps[k], f"{f.id}: --set hf.{k}={v} on gfx1151, the docs cap {k} at {caps[k]}"
    assert seen


# ---- every --help works, and a reader that leaves early (`| head`) gets a quiet exit ----

def _toolbox_commands() -> list[list[str]]:
    from toolbox.cli import COMMANDS

    nested = [["cluster", "launch"], ["cluster", "check"], ["patches", "verify"],
              ["bench", "run"], ["bench", "list"], ["bench", "render"]]
    return [["-m", "toolbox"]] + [["-m", "toolbox", c] for c in sorted(COMMANDS)] + [["-m", "toolbox", *n] for n in nested]


HELP = _toolbox_commands() + [["-m", m] for m in SCRIPTS.values() if m != "toolbox"]
def _run(args: list[str], stdout) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "entrypoints")])}
    env.pop("PYTHONUNBUFFERED", None)  # a shell's buffered stdout: where a closed pipe shows at exit
    return subprocess.run([sys.executable, *args], stdout=stdout, stderr=subprocess.PIPE, text=True,
                          env=env, cwd=ROOT, timeout=300)


@pytest.mark.parametrize("args", [[*a, "--help"] for a in HELP], ids=lambda a: " ".join(a[1:]))
def test_help_works(args):
    cp = _run(args, subprocess.PIPE)
    assert cp.returncode == 0, cp.stderr
    assert "usage:" in cp.stdout and not cp.stderr


QUIET = [*([*a, "--help"] for a in HELP),
         ["-m", "toolbox", "stacks"], ["-m", "toolbox", "render", "--stack", "gfx1151"],
         ["-m", "toolbox", "bench", "list", "--suite", "all"], ["-m", "toolbox_train.bench", "list", "--suite", "all"]]


@pytest.mark.parametrize("args", QUIET, ids=lambda a: " ".join(a[1:]))
def test_a_reader_that_left_gets_a_quiet_exit(args):
    """`CMD | head -1`, made deterministic: the pipe's reader is gone before CMD writes a byte."""
    r, w = os.pipe()
    os.close(r)
    try:
        cp = _run(args, w)
    finally:
        os.close(w)
    assert cp.returncode == 0 and cp.stderr == "", f"exit {cp.returncode}: {cp.stderr[-2000:]}"


def test_docs_name_the_checkpoint_staging_folder_the_code_uses():
    """Checkpoints are staged in `.partial-node<R>/` (one per node), not `.partial/`."""
    from toolbox_train.runs import checkpoints

    trainer = (ROOT / "entrypoints" / "toolbox_train" / "training" / "trainer.py").read_text()
    assert "{checkpoints.PARTIAL}-node" in trainer, "the code changed: update this test and the docs"
    for f in DOCS:
        assert f"{checkpoints.PARTIAL}/" not in f.read_text(), f"{f.relative_to(ROOT)} names {checkpoints.PARTIAL}/"
