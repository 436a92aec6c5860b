"""The `toolbox` CLI: lazy command imports, --help everywhere, one line per error, quiet pipes."""

from __future__ import annotations

import argparse
import importlib
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from toolbox import cli
from toolbox.rendering import render_dockerfile
from toolbox.stack.load import load_stack

ROOT = Path(__file__).resolve().parents[1]

# Runs toolbox's main() in a Python where the train extra cannot be imported (as in a venv with
# only `pip install -e .`, which installs toolbox_train's code but not torch & co.): a meta_path
# finder refuses them. BLOCK_TRAIN=1 refuses toolbox_train's modules too, all but the torch-free
# bottom layer the host shares: safe_yaml (YAML), contract (errors) and disk (the atomic write).
BLOCKED = ("torch", "transformers", "trl", "peft", "accelerate", "datasets", "matplotlib")
ALLOWED = ("toolbox_train", "toolbox_train.safe_yaml", "toolbox_train.contract", "toolbox_train.disk")
BOOT = textwrap.dedent(f"""
    import os, sys
    class Block:
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in {BLOCKED!r} or (os.environ.get("BLOCK_TRAIN") == "1"
                    and name.startswith("toolbox_train") and name not in {ALLOWED!r}):
                raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
    sys.meta_path.insert(0, Block())
    from toolbox.cli import main
    raise SystemExit(main(sys.argv[1:]))
""")


def without_train(*args: str, block_train_code: bool = False) -> subprocess.CompletedProcess:
    env = {**os.environ, "BLOCK_TRAIN": "1" if block_train_code else "0"}
    return subprocess.run([sys.executable, "-c", BOOT, *args], cwd=ROOT, capture_output=True, text=True, env=env)


@pytest.mark.parametrize("block_train_code", [False, True])
def test_render_and_stacks_work_without_the_train_extra(tmp_path, block_train_code):
    out = tmp_path / "Dockerfile"
    r = without_train("render", "--stack", "cpu", "-o", str(out), block_train_code=block_train_code)
    assert r.returncode == 0, r.stderr
    assert out.read_text() == render_dockerfile(load_stack("cpu"))
    r = without_train("stacks", block_train_code=block_train_code)
    assert r.returncode == 0 and r.stdout.startswith("cpu\t"), r.stderr
    r = without_train("--help", block_train_code=block_train_code)
    assert r.returncode == 0 and "bench" in r.stdout and "render" in r.stdout
    # the blocker really blocks: the command that needs the extra says so in one line
    out = tmp_path / "bench-out"
    r = without_train("bench", "run", "--device", "cpu", "--out", str(out), block_train_code=block_train_code)
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert r.stderr.strip().count("\n") == 0 and "strix-toolbox[train]" in r.stderr, r.stderr


def test_command_table_matches_what_modules_register():
    parser = cli.build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    registered = {c.dest: c.help for c in sub._choices_actions}
    assert registered == {name: help_line for name, (_, help_line) in cli.COMMANDS.items()}
    for name, (module, _) in cli.COMMANDS.items():
        assert hasattr(importlib.import_module(f"toolbox.commands.{module}"), "register"), name


def _all_helps(parser: argparse.ArgumentParser, path: tuple = ()):
    yield path
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, child in action.choices.items():
                yield from _all_helps(child, path + (name,))


@pytest.mark.parametrize("command", sorted(cli.COMMANDS))
def test_every_subcommand_help(command, capsys):
    parser = cli.build_parser([command])
    for path in _all_helps(parser):
        with pytest.raises(SystemExit) as exc:
            cli.main([*path, "--help"])
        assert exc.value.code == 0, path
        assert "usage: toolbox" in capsys.readouterr().out


def test_stacks_into_head_exits_quietly():
    r = subprocess.run(f"{sys.executable} -m toolbox stacks | head -c 1", shell=True, cwd=ROOT,
                       capture_output=True, text=True, executable="/bin/bash")
    assert r.returncode == 0 and r.stderr == "" and len(r.stdout) == 1
    for command in ("stacks", "render --stack gfx1151"):
        r = subprocess.run(["bash", "-o", "pipefail", "-c", f"{sys.executable} -m toolbox {command} | true"],
                           cwd=ROOT, capture_output=True, text=True)
        assert r.returncode == 0 and r.stderr == "", (command, r.stderr)
    r = subprocess.run(["bash", "-o", "pipefail", "-c", f"{sys.executable} -m toolbox render --stack gfx1151 | head -1"],
                       cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0 and r.stderr == "" and r.stdout.count("\n") == 1


def test_unexpected_error_is_one_line_and_debug_shows_the_traceback(monkeypatch, capsys):
    from toolbox.commands import stacks

    def broken(args):
        return {}["no such key"]

    monkeypatch.setattr(stacks, "run", broken)
    assert cli.main(["stacks"]) == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.count("\n") == 1 and "KeyError" in err and "--debug" in err
    assert cli.main(["--debug", "stacks"]) == 1
    assert "Traceback" in capsys.readouterr().err
    monkeypatch.setenv("TOOLBOX_DEBUG", "1")
    assert cli.main(["stacks"]) == 1
    assert "Traceback" in capsys.readouterr().err


def test_output_in_an_unwritable_place_is_a_user_error(tmp_path):
    r = subprocess.run([sys.executable, "-m", "toolbox", "render", "--stack", "cpu", "-o", "/proc/toolbox-x"],
                       cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 2 and "Traceback" not in r.stderr and "/proc/toolbox-x" in r.stderr
