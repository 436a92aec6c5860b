"""The stack's Python lock (issue 12, item 4): what the cpu stack's checked-in lock holds and
how a render uses it. The build that installs from it (and fails on a tampered hash) is in
tests/engines/test_pylock_build.py."""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import sys
from pathlib import Path

from toolbox import pylock
from toolbox.render import render_dockerfile
from toolbox.stack import load_stack

ROOT = Path(__file__).resolve().parents[1]


def test_cpu_lock_is_current_and_complete():
    stack = load_stack("cpu")
    lock = pylock.current(stack)
    assert lock == ROOT / "toolbox" / "stacks" / "cpu.pylock.txt", "run `toolbox lock --stack cpu`"
    pkgs = pylock.parse(lock.read_text())
    # the floating dependencies of issue 12 are pinned, each with at least one sha256
    for name in ("tokenizers", "huggingface-hub", "safetensors", "numpy", "torch", "transformers", "psutil"):
        assert name in pkgs, name
        assert any("--hash=sha256:" in line for line in pkgs[name]["block"]), name
    for line in lock.read_text().splitlines():
        if re.match(r"^[A-Za-z0-9]", line):
            assert "==" in line, f"not an exact pin: {line}"


def test_local_torch_wheel_is_hashed_from_the_file():
    dirs = [d for d in [*(os.environ.get("PIP_FIND_LINKS") or "").split(), "/opt/wheels"] if Path(d).is_dir()]
    files = [w for d in dirs for w in sorted(Path(d).glob("torch-2.13.0+cpu-*.whl"))]
    if not files:
        import pytest

        pytest.skip("no local torch 2.13.0+cpu wheel on this machine")
    block = "\n".join(pylock.parse(pylock.lock_path(load_stack("cpu")).read_text())["torch"]["block"])
    assert hashlib.sha256(files[0].read_bytes()).hexdigest() in block


def test_render_installs_with_require_hashes_in_two_steps():
    stack = load_stack("cpu")
    text = render_dockerfile(stack)
    assert text.count("--require-hashes --no-deps -r /opt/toolbox/python-lock/") == 2
    torch_part, everything = pylock.split(pylock.current(stack).read_text())
    assert re.search(r"^torch==", torch_part, re.M) and not re.search(r"^transformers==", torch_part, re.M)
    assert re.search(r"^transformers==", everything, re.M)
    sha = hashlib.sha256(pylock.current(stack).read_bytes()).hexdigest()
    assert stack.lock()["python.lock.sha256"] == sha  # a pin: part of the lock digest, the tag


def test_moved_pins_build_unlocked_with_a_warning(tmp_path):
    stack = load_stack("cpu", ["hf.peft=0.18.1"])
    assert pylock.current(stack) is None and "python.lock.sha256" not in stack.lock()
    # torch's pins did not move: its step stays locked (and its cached layer valid), the rest is not
    text = render_dockerfile(stack)
    assert text.count("--require-hashes") == 1 and "python-lock/torch.txt" in text and "peft==0.18.1" in text
    assert stack.lock()["python.lock.torch.sha256"] == load_stack("cpu").lock()["python.lock.torch.sha256"]
    moved = load_stack("cpu", ["torch.torch=2.12.0+cpu"])
    assert pylock.torch_current(moved) is None and "--require-hashes" not in render_dockerfile(moved)
    assert stack.lock_digest() != load_stack("cpu").lock_digest()
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{ROOT / 'entrypoints'}", "TMPDIR": str(tmp_path)}
    cp = subprocess.run([sys.executable, "-m", "toolbox", "build", "--stack", "cpu", "--set", "hf.peft=0.18.1",
                         "--engine", "podman", "--dry-run"], capture_output=True, text=True, env=env, cwd=ROOT)
    assert cp.returncode == 0, cp.stderr
    assert "cpu.pylock.txt was made for other pins" in cp.stderr


def test_rocm_stacks_are_refused_with_the_reason():
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{ROOT / 'entrypoints'}"}
    cp = subprocess.run([sys.executable, "-m", "toolbox", "lock", "--stack", "gfx1151"],
                        capture_output=True, text=True, env=env, cwd=ROOT)
    assert cp.returncode == 2 and "AMD's index" in cp.stderr and "Traceback" not in cp.stderr
