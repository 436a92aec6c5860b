"""The module boundaries of the training code that others rely on."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_launch_and_the_checks_import_nothing_heavy():
    # launch runs finetune's checks in its own process before any rank starts: importing them
    # must not pull in the trainer, TRL, transformers or torch (seconds, and GPU libraries).
    code = ("import sys, toolbox_train.commands.launch, toolbox_train.planning.run, toolbox_train.commands.finetune, toolbox_train.bench; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'transformers', 'trl', 'peft', "
            "'datasets', 'accelerate') or m in ('toolbox_train.training.trainer', 'toolbox_train.training.loading')))")
    env = {**os.environ, "PYTHONPATH": f"{ROOT / 'entrypoints'}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]", out


def test_bench_runs_as_a_module():
    env = {**os.environ, "PYTHONPATH": f"{ROOT / 'entrypoints'}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    p = subprocess.run([sys.executable, "-m", "toolbox_train.bench", "list", "--shapes", "tiny-llama", "--suite", "smoke"],
                       env=env, capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    assert "tiny-llama/" in p.stdout


def test_planning_imports_nothing_heavy():
    # The memory planner answers `--plan` and launch's checks in a fraction of a second: every
    # planning module, calibration included (its GPU work imports torch when it runs).
    code = ("import sys, toolbox_train.planning.run, toolbox_train.models.arithmetic, "
            "toolbox_train.planning.memory, toolbox_train.bench.calibration; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'transformers', 'trl', 'peft', "
            "'datasets', 'accelerate')))")
    env = {**os.environ, "PYTHONPATH": f"{ROOT / 'entrypoints'}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]", out


def test_the_training_package_imports_nothing_of_the_builder():
    # The image installs entrypoints/ alone: an import of `toolbox` there fails only in the image.
    import ast

    found = []
    for f in sorted((ROOT / "entrypoints" / "toolbox_train").rglob("*.py")):
        for node in ast.walk(ast.parse(f.read_text(encoding="utf-8"))):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                     [node.module or ""] if isinstance(node, ast.ImportFrom) and node.level == 0 else [])
            found += [f"{f.relative_to(ROOT)}: {n}" for n in names if n.split(".")[0] == "toolbox"]
    assert found == []
