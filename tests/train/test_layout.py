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
    code = ("import sys, toolbox_train.distributed.launch, toolbox_train.planning.checks, toolbox_train.training.finetune, toolbox_train.bench; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'transformers', 'trl', 'peft', "
            "'datasets', 'accelerate') or m in ('toolbox_train.training.trainer', 'toolbox_train.training.models')))")
    env = {**os.environ, "PYTHONPATH": f"{ROOT / 'entrypoints'}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]", out


def test_bench_runs_as_a_module():
    env = {**os.environ, "PYTHONPATH": f"{ROOT / 'entrypoints'}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    p = subprocess.run([sys.executable, "-m", "toolbox_train.bench", "list", "--shapes", "tiny-llama", "--suite", "smoke"],
                       env=env, capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    assert "tiny-llama/" in p.stdout
