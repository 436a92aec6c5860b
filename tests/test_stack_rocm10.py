"""The ROCm 10.0 stack (the default): its pins as `toolbox stacks` shows them, its RCCL stage, its
bitsandbytes library check, and the fault-injection rule for every shipped RCCL build."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from toolbox.components.bitsandbytes import rocm_library
from toolbox.components.torch import install_requirements, requirements
from toolbox.paths import DEFAULT_STACK
from toolbox.render import render_dockerfile
from toolbox.stack.load import load_stack, stack_names

ROOT = Path(__file__).resolve().parents[1]
SHA = "4feabd9f2da72352df37f6d714a54847d3fe913c0341fbe2a6542c1164024baf"

# rocm-systems commits that contain #8484 ("rccl: disable net-ib level fault injection by default",
# merged 2026-07-13). None of the shipped ones is known to: 79e85e14 (7.13), 2b22ab01 (7.14,
# 2026-07-09) and 0f191289 (2026-02-27) predate it; for 6b0e43f3 (release/therock-10.0, 2026-08-21)
# its branch history could not be read, and ROCm 10.0.0's release notes still list the slow
# multi-node collectives (ROCm/ROCm #6493) with -DFAULT_INJECTION=OFF as the workaround.
HAS_8484: set[str] = set()


def rccl_stage(text: str) -> str:
    stage = text[text.index("FROM devel AS rccl-build"):]
    return stage[:stage.index("\nFROM ")]


def test_rocm10_is_the_default_and_stacks_shows_its_verified_pins():
    assert DEFAULT_STACK == "gfx1151-rocm10.0" and load_stack().name == "gfx1151-rocm10.0"
    r = subprocess.run([sys.executable, "-m", "toolbox", "stacks"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    line = next(ln for ln in lines if ln.startswith("gfx1151-rocm10.0\t"))
    assert "rocm=10.0.0" in line and "torch=2.13.0+rocm10.0.0" in line and "rccl=6b0e43f34119" in line
    assert f"rocm.sha256={SHA}" in line
    # Only the base digest is left to first use (no registry here); tarball and torch wheels are pinned.
    assert line.endswith("unverified=base\t(default)")
    assert [ln for ln in lines if ln.endswith("(default)")] == [line]
    # 7.13 stays a named stack, as it was.
    assert "rocm=7.13.0" in next(ln for ln in lines if ln.startswith("gfx1151\t"))


def test_torch_is_installed_by_url_and_sha256_with_the_device_extra():
    s = load_stack("gfx1151-rocm10.0")
    assert requirements(s) == ["torch[device-gfx1151]==2.13.0+rocm10.0.0",
                               "torchvision[device-gfx1151]==0.28.0+rocm10.0.0", "torchaudio==2.11.0.2+rocm10.0.0"]
    reqs = install_requirements(s)
    assert reqs[0].startswith("torch[device-gfx1151] @ https://stable.repo.amd.com/rocm/pytorch/whl-next/torch/"
                              "torch-2.13.0%2Brocm10.0.0-cp313-cp313-linux_x86_64.whl#sha256=28cbb1dd")
    assert all("#sha256=" in r for r in reqs)
    assert s.base.python == "python3.13" and "torch" not in s.unverified_pins()


def test_rccl_is_built_from_the_releases_own_commit_without_a_series():
    stage = rccl_stage(render_dockerfile(load_stack("gfx1151-rocm10.0")))
    assert "git-fetch.sh https://github.com/ROCm/rocm-systems 6b0e43f341195e203754e08f850e437ff2fc09f9" in stage
    assert "apply-patches.sh" not in stage and "-DFAULT_INJECTION=OFF" in stage
    assert "-DEXPLICIT_ROCM_VERSION=10.0.0" in stage


@pytest.mark.parametrize("name", [n for n in stack_names() if load_stack(n).rccl is not None])
def test_every_rccl_build_without_8484_has_fault_injection_off(name):
    s = load_stack(name)
    stage = rccl_stage(render_dockerfile(s))
    if s.rccl.commit not in HAS_8484:
        assert s.rccl.fault_injection is False
        assert "-DFAULT_INJECTION=OFF" in stage
        assert s.pins()["rccl.fault_injection"] == "false"  # part of the image tag
    # The stack file says why, next to the field.
    text = s.source.read_text()
    assert "fault_injection: false" in text and "#8484" in text


def test_fault_injection_unset_leaves_rcclss_default(tmp_path):
    p = tmp_path / "s.yaml"
    p.write_text("extends: gfx1151-rocm10.0\nrccl:\n  fault_injection: null\n")
    s = load_stack(str(p))
    assert "FAULT_INJECTION" not in rccl_stage(render_dockerfile(s)) and "rccl.fault_injection" not in s.pins()


def test_bitsandbytes_library_follows_hip_not_the_rocm_release():
    s = load_stack("gfx1151-rocm10.0")
    assert s.rocm.hip == "7.15" and rocm_library(s) == "libbitsandbytes_rocm715.so"
    assert rocm_library(load_stack("gfx1151-rocm7.14")) == "libbitsandbytes_rocm714.so"
    text = render_dockerfile(s)
    assert "bitsandbytes==0.50.2" in text
    assert "55348a9a4a21bfd99cf8c7b32fe67b4030ae5c2a05738e03c1747f65fa6ec283 /tmp/bnb/bitsandbytes-0.50.2-" in text
    # The build asks bitsandbytes which library it picks for torch's HIP, and fails on another one.
    assert 'assert hip == "7.15"' in text
    assert 'assert lib.name == "libbitsandbytes_rocm715.so"' in text and "get_cuda_bnb_library_path" in text


def test_bad_hip_version_is_one_line_exit_2(tmp_path):
    p = tmp_path / "s.yaml"
    p.write_text("extends: gfx1151-rocm10.0\nrocm:\n  hip_version: 7.15\n")
    r = subprocess.run([sys.executable, "-m", "toolbox", "render", "--stack", str(p)], cwd=ROOT,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "Traceback" not in r.stderr and r.stdout == ""
    assert f"{p}:3: rocm.hip_version" in r.stderr


@pytest.mark.parametrize("manifest_commit,ok", [
    ("6b0e43f341195e203754e08f850e437ff2fc09f9", True),
    ("2b22ab0195cc1461cd9abf3b969e9dd7c10af350", False),  # a 7.14 tarball under the 10.0 RCCL: refused
    (None, True),  # a manifest that names no rocm-systems: nothing to compare (the first-use check alike)
])
def test_rccl_stage_checks_the_tarballs_manifest_names_its_commit(tmp_path, manifest_commit, ok):
    """The rccl stage's manifest check, run as the build would (the RUN's Python, with the
    manifest's path pointed at a file here)."""
    import json

    stage = rccl_stage(render_dockerfile(load_stack("gfx1151-rocm10.0")))
    run = stage[stage.index("RUN /opt/venv/bin/python -c '") + len("RUN /opt/venv/bin/python -c '"):]
    code = run[:run.index("'\n")].replace("\\\n", "")
    subs = [{"path": "rocm-libraries", "url": "https://github.com/ROCm/rocm-libraries.git", "commit": "a" * 40}]
    if manifest_commit:
        subs.append({"path": "rocm-systems", "url": "https://github.com/ROCm/rocm-systems.git", "commit": manifest_commit})
    m = tmp_path / "therock_manifest.json"
    m.write_text(json.dumps({"schema": "TheRock-Manifest.v1", "submodules": subs}))
    code = code.replace("/opt/rocm/share/therock/therock_manifest.json", str(m))
    r = subprocess.run([sys.executable, "-S", "-c", code], capture_output=True, text=True, timeout=60)
    assert (r.returncode == 0) == ok, r.stderr
    if not ok:
        assert "built from rocm-systems {'2b22ab01" in r.stderr and "rccl.commit is 6b0e43f3" in r.stderr
