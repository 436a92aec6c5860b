"""The stack's Python lock (issue 12, item 4): what the cpu stack's checked-in lock holds and
how a render uses it. The build that installs from it (and fails on a tampered hash) is in
tests/engines/test_pylock_build.py."""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from toolbox.stack import python_lock, statefiles
from toolbox.rendering import render_dockerfile
from toolbox.paths import STACKS_DIR
from toolbox.stack.load import load_stack

ROOT = Path(__file__).resolve().parents[1]


def test_cpu_lock_is_current_and_complete():
    stack = load_stack("cpu")
    lock = python_lock.current(stack)
    assert lock == ROOT / "toolbox" / "stacks" / "cpu.pylock.txt", "run `toolbox lock --stack cpu`"
    pkgs = python_lock.parse(lock.read_text())
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
        pytest.skip("no local torch 2.13.0+cpu wheel on this machine")
    block = "\n".join(python_lock.parse(python_lock.lock_path(load_stack("cpu")).read_text())["torch"]["block"])
    assert hashlib.sha256(files[0].read_bytes()).hexdigest() in block


def test_render_installs_with_require_hashes_in_two_steps():
    stack = load_stack("cpu")
    text = render_dockerfile(stack)
    assert text.count("--require-hashes --no-deps -r /opt/toolbox/python-lock/") == 2
    torch_part, everything = python_lock.split(python_lock.current(stack).read_text())
    assert re.search(r"^torch==", torch_part, re.M) and not re.search(r"^transformers==", torch_part, re.M)
    assert re.search(r"^transformers==", everything, re.M)
    # a pin: part of the lock digest, the tag; of the lock without its `# checksum:` line, which
    # is that same sha256
    text = python_lock.current(stack).read_text()
    sha = hashlib.sha256(statefiles.without_checksum(text).encode()).hexdigest()
    assert stack.pins()["python.lock.sha256"] == sha and f"# checksum: sha256:{sha}\n" in text


def _cli(*args: str, tmp_path: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{ROOT / 'entrypoints'}", "TMPDIR": str(tmp_path), **(env or {})}
    return subprocess.run([sys.executable, "-m", "toolbox", *args], capture_output=True, text=True, env=env, cwd=ROOT)


def test_moved_pins_are_refused_or_built_unlocked_with_a_warning(tmp_path):
    stack = load_stack("cpu", ["hf.peft=0.18.1"])
    assert python_lock.current(stack) is None and "python.lock.sha256" not in stack.pins()
    # torch's pins did not move: its step stays locked (and its cached layer valid), the rest is not
    text = render_dockerfile(stack)
    assert text.count("--require-hashes") == 1 and "python-lock/torch.txt" in text and "peft==0.18.1" in text
    assert stack.pins()["python.lock.torch.sha256"] == load_stack("cpu").pins()["python.lock.torch.sha256"]
    moved = load_stack("cpu", ["torch.torch=2.12.0+cpu"])
    assert python_lock.torch_current(moved) is None and "--require-hashes" not in render_dockerfile(moved)
    assert stack.digest() != load_stack("cpu").digest()
    build = ("build", "--stack", "cpu", "--set", "hf.peft=0.18.1", "--engine", "podman", "--dry-run")
    cp = _cli(*build, tmp_path=tmp_path)
    assert cp.returncode == 2 and cp.stdout == "" and not list(tmp_path.iterdir())  # refused before anything
    assert cp.stderr.splitlines() == [
        f"toolbox: error: {python_lock.lock_path(stack)}: the Python lock is for other pins than this build's: "
        "run `toolbox lock --stack cpu --set hf.peft=0.18.1` (or build --unlocked: no hash checks)"]
    cp = _cli(*build, "--unlocked", tmp_path=tmp_path)
    assert cp.returncode == 0, cp.stderr
    assert "cpu.pylock.txt was made for other pins (its torch part still holds and is used)" in cp.stderr
    cp = _cli(*build, "--unlocked", "--frozen", tmp_path=tmp_path)
    assert cp.returncode == 2 and "not with --frozen" in cp.stderr
    cp = _cli("lock", "--stack", "cpu", "--set", "hf.peft=0.18.1", "--check", tmp_path=tmp_path)
    assert cp.returncode == 2 and "not made from stack cpu's pins" in cp.stderr and "Traceback" not in cp.stderr


def test_a_set_pin_set_locked_into_the_user_state_is_used(tmp_path, monkeypatch):
    """What `toolbox lock --stack cpu --set hf.peft=...` writes (made here from the shipped lock,
    offline): the build then finds it, and it never replaces the checked-in lock."""
    monkeypatch.setenv("TOOLBOX_STATE_DIR", str(tmp_path / "state"))
    stack = load_stack("cpu", ["hf.peft=0.21.1"])
    user = python_lock.user_lock_path(stack)
    assert user.is_relative_to(tmp_path / "state")
    text = python_lock.lock_path(stack).read_text()
    text = re.sub(r"(?m)^# inputs: .*$", f"# inputs: {python_lock.inputs_digest(stack)}", text)
    user.parent.mkdir(parents=True)
    user.write_text(statefiles.with_checksum(text.replace("peft==0.21.2", "peft==0.21.1")))
    again = load_stack("cpu", ["hf.peft=0.21.1"])
    assert python_lock.current(again) == user and python_lock.check(again, "cpu", ["hf.peft=0.21.1"]) is None
    assert again.pins()["python.lock.sha256"] == python_lock.content_digest(user)
    assert "--require-hashes --no-deps -r /opt/toolbox/python-lock/all.txt" in render_dockerfile(again)
    assert python_lock.current(load_stack("cpu")) == python_lock.lock_path(stack)


def test_every_shipped_stack_is_locked_and_current():
    """A pin changed without `toolbox lock` (`toolbox bump` relocks) fails here."""
    from toolbox.stack.load import stack_names

    for name in stack_names():
        stack = load_stack(name)
        assert python_lock.current(stack) == python_lock.lock_path(stack), f"run `toolbox lock --stack {name}`"
        assert python_lock.check(stack, name) is None


def test_amd_wheels_are_first_use_and_the_rest_is_locked():
    stack = load_stack("gfx1151-rocm7.14")
    text = python_lock.current(stack).read_text()
    for req in ("torch[device-gfx1151]==2.11.0+rocm7.14.0", "torchaudio==2.11.0+rocm7.14.0"):
        assert f"# first-use: {req} from https://repo.amd.com/rocm/whl-multi-arch/" in text
    pkgs = python_lock.parse(text)
    assert "torch" not in pkgs and "nvidia-cublas" not in pkgs  # PyPI's torch did not stand in
    assert {"transformers", "tokenizers", "huggingface-hub", "numpy", "bitsandbytes"} <= set(pkgs)
    # the PyPI bitsandbytes wheel the stack pins by sha256 is one of the lock's files
    assert f"--hash=sha256:{stack.model.bitsandbytes.wheel_sha256}" in "\n".join(pkgs["bitsandbytes"]["block"])
    d = render_dockerfile(stack)
    assert "python-lock/torch.txt" not in d and "torch[device-gfx1151]==2.11.0+rocm7.14.0" in d
    assert "--require-hashes --no-deps -r /opt/toolbox/python-lock/all.txt" in d
    moved = load_stack("gfx1151-rocm7.14", ["torch.torch=2.12.0+rocm7.14.0"])
    assert python_lock.current(moved) is None  # a first-use pin is an input too


def test_one_changed_hash_is_another_tag(tmp_path):
    shutil.copy(STACKS_DIR / "cpu.yaml", tmp_path / "cpu.yaml")
    lock = (STACKS_DIR / "cpu.pylock.txt").read_text()
    (tmp_path / "cpu.pylock.txt").write_text(lock)
    same = load_stack(str(tmp_path / "cpu.yaml"))
    assert same.digest() == load_stack("cpu").digest()
    good = re.search(r"(?m)^numpy==\S+ \\\n    --hash=sha256:([0-9a-f]{64})", lock)[1]
    # a lock written again with another hash (its checksum made anew: an edit by hand is refused,
    # tests/test_state_files.py)
    (tmp_path / "cpu.pylock.txt").write_text(statefiles.with_checksum(lock.replace(good, good[::-1], 1)))
    assert load_stack(str(tmp_path / "cpu.yaml")).digest() != same.digest()


@pytest.mark.skipif(not (shutil.which("uv") or (Path(sys.executable).parent / "uv").exists()), reason="uv (test extra)")
def test_lock_resolves_the_same_file_twice(tmp_path):
    """`toolbox lock` of a copy of gfx1151 (PyPI only: AMD's wheels are first-use): twice the same bytes."""
    shutil.copy(STACKS_DIR / "gfx1151.yaml", tmp_path / "gfx1151.yaml")
    outs = []
    for _ in range(2):
        cp = _cli("lock", "--stack", str(tmp_path / "gfx1151.yaml"), tmp_path=tmp_path)
        assert cp.returncode == 0, cp.stderr
        outs.append((tmp_path / "gfx1151.pylock.txt").read_text())
    assert outs[0] == outs[1] and "# first-use: torch==2.11.0+rocm7.13.0" in outs[0]
    assert python_lock.current(load_stack(str(tmp_path / "gfx1151.yaml"))) == tmp_path / "gfx1151.pylock.txt"


def test_ray_is_a_layer_of_its_own_in_the_gpu_stacks_and_absent_from_cpu():
    from toolbox.components import pylock as pylock_component

    for name in ("cuda", "gfx1151"):
        stack = load_stack(name)
        whole = python_lock.parse(python_lock.current(stack).read_text())
        ray_part = python_lock.parse(pylock_component.ray_part(stack))
        rest = python_lock.parse(pylock_component._parts(stack)[1])
        # the two steps install the whole lock, each package once
        assert set(ray_part) | set(rest) == set(whole) and not set(ray_part) & set(rest)
        assert "ray" in ray_part and "transformers" in rest and "torch" not in ray_part
        # what ray shares with the training stack stays in the training stack's layer
        shared = [n for n, p in whole.items() if "ray" in p["via"] and p["via"] - set(ray_part)]
        assert shared and all(n in rest for n in shared)
        text = render_dockerfile(stack)
        assert text.index("python-lock/ray.txt") > text.index("python-lock/all.txt")
        assert stack.pins()["ray.version"] == "2.60.0"
    cpu = load_stack("cpu")
    assert "ray" not in python_lock.parse(python_lock.current(cpu).read_text())
    assert "ray" not in render_dockerfile(cpu).lower().replace("array", "")


def test_only_keeps_what_another_root_also_needs():
    lock = ("ray==1 \\\n    # via (stack)\nmsgpack==1 \\\n    # via ray\naiohttp==1 \\\n    # via\n"
            "    #   datasets\n    #   ray\nyarl==1 \\\n    # via aiohttp\ndatasets==1 \\\n    # via (stack)\n")
    assert python_lock.only(lock, "ray") == {"ray", "msgpack"}
    assert python_lock.only(lock, "absent") == set()
