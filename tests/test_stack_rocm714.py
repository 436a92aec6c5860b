"""The ROCm 7.14 stack's model fields: torch from a multi-arch index (device extras) and
bitsandbytes from the PyPI wheel (sha256 checked) instead of a source build."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from toolbox.components.torch import requirements
from toolbox.errors import UserError
from toolbox.rendering import render_dockerfile
from toolbox.stack.load import load_stack

ROOT = Path(__file__).resolve().parents[1]


def write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "s.yaml"
    p.write_text(textwrap.dedent(text).lstrip())
    return p


def test_multi_arch_torch_gets_one_device_extra_per_target():
    s = load_stack("gfx1151-rocm7.14")
    assert requirements(s) == ["torch[device-gfx1151]==2.11.0+rocm7.14.0",
                               "torchvision[device-gfx1151]==0.26.0+rocm7.14.0",
                               "torchaudio==2.11.0+rocm7.14.0"]
    # The per-arch 7.13 index takes plain names.
    assert requirements(load_stack("gfx1151"))[0] == "torch==2.11.0+rocm7.13.0"


def test_pypi_bitsandbytes_is_downloaded_and_hash_checked_not_built():
    text = render_dockerfile(load_stack("gfx1151-rocm7.14"))
    assert "AS bitsandbytes-build" not in text
    assert "pip.sh download --no-deps --only-binary=:all: -d /tmp/bnb bitsandbytes==0.50.1" in text
    assert "649b4348c24c05c406a3b8fa9ed6ea00ffecb9dc93dcf838af1a2783844bf3e3 /tmp/bnb/bitsandbytes-0.50.1-" in text
    assert "sha256sum -c /tmp/bnb.sha256" in text
    # The built wheel stays for the 7.13 stack (PyPI ships no ROCm 7.13 build).
    assert "AS bitsandbytes-build" in render_dockerfile(load_stack("gfx1151"))


@pytest.mark.parametrize("block,message", [
    ("bitsandbytes:\n  source: pypi\n  wheel_sha256: " + "a" * 64,
     "bitsandbytes: source: pypi installs the released wheel: set `commit: null`"),
    ("bitsandbytes:\n  source: pypi\n  commit: null",
     "bitsandbytes: source: pypi needs `wheel_sha256`"),
    ("bitsandbytes:\n  wheel_sha256: " + "a" * 64, "bitsandbytes: wheel_sha256 belongs to source: pypi"),
    ("bitsandbytes:\n  source: pypi\n  commit: null\n  wheel_sha256: abc", "must be 64 lowercase hex"),
])
def test_bitsandbytes_source_rules(tmp_path, block, message):
    p = write(tmp_path, "extends: gfx1151\n" + block + "\n")
    with pytest.raises(UserError) as exc:
        load_stack(str(p))
    assert message in str(exc.value) and str(p) in str(exc.value)


def test_cli_bad_bitsandbytes_is_exit_2_one_line(tmp_path):
    p = write(tmp_path, "extends: gfx1151-rocm7.14\nbitsandbytes:\n  source: wheel\n")
    r = subprocess.run([sys.executable, "-m", "toolbox", "render", "--stack", str(p)], cwd=ROOT,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert f"{p}:3: bitsandbytes.source" in r.stderr


def test_toolbox_stacks_lists_the_rocm714_stack_and_its_unverified_pins():
    r = subprocess.run([sys.executable, "-m", "toolbox", "stacks"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    line = next(ln for ln in r.stdout.splitlines() if ln.startswith("gfx1151-rocm7.14\t"))
    assert "rocm=7.14.0" in line and "torch=2.11.0+rocm7.14.0" in line and "rccl=2b22ab0195cc" in line
    assert line.endswith("unverified=base,rocm.tarball,torch")


def test_rocm714_rccl_stage_builds_the_tagged_commit_without_a_series():
    text = render_dockerfile(load_stack("gfx1151-rocm7.14"))
    stage = text[text.index("FROM devel AS rccl-build"):]
    stage = stage[:stage.index("\nFROM ")]
    assert "git-fetch.sh https://github.com/ROCm/rocm-systems 2b22ab0195cc1461cd9abf3b969e9dd7c10af350" in stage
    assert "apply-patches.sh" not in stage and "-DENABLE_AMDSMI=ON" in stage
    assert '-DGPU_TARGETS="gfx1151"' in stage
