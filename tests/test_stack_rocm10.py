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
from toolbox.rendering import render_dockerfile
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


def test_rocm10_1_is_the_default_and_stacks_shows_10_0s_verified_pins():
    """The default by docs/stacks.md's rule: 10.1.0 (released 2026-10-05, more than a month ago,
    no known failure standing), its pins left to first use; 10.0 stays, every pin verified."""
    assert DEFAULT_STACK == "gfx1151-rocm10.1" and load_stack().model.name == "gfx1151-rocm10.1"
    r = subprocess.run([sys.executable, "-m", "toolbox", "stacks"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    line = next(ln for ln in lines if ln.startswith("gfx1151-rocm10.1\t"))
    assert "rocm=10.1.0" in line and "torch=2.14.0+rocm10.1.0" in line and "rccl=unverified" in line
    assert line.endswith("unverified=base,rccl,rocm.tarball,torch\t(default)")
    assert [ln for ln in lines if ln.endswith("(default)")] == [line]
    line = next(ln for ln in lines if ln.startswith("gfx1151-rocm10.0\t"))
    assert "rocm=10.0.0" in line and "torch=2.13.0+rocm10.0.0" in line and "rccl=6b0e43f34119" in line
    assert f"rocm.sha256={SHA}" in line
    # Only the base digest is left to first use (no registry here); tarball and torch wheels are pinned.
    assert line.endswith("unverified=base")
    # 7.13 stays a named stack, as it was.
    assert "rocm=7.13.0" in next(ln for ln in lines if ln.startswith("gfx1151\t"))


def test_torch_is_installed_by_url_and_sha256_with_the_device_extra():
    s = load_stack("gfx1151-rocm10.0")
    assert requirements(s) == ["torch[device-gfx1151]==2.13.0+rocm10.0.0",
                               "torchvision[device-gfx1151]==0.28.0+rocm10.0.0", "torchaudio==2.11.0.2+rocm10.0.0"]
    reqs = install_requirements(s)
    assert reqs[0].startswith("torch[device-gfx1151] @ https://stable.repo.amd.com/rocm/whl-next/torch/"
                              "torch-2.13.0%2Brocm10.0.0-cp313-cp313-linux_x86_64.whl#sha256=28cbb1dd")
    assert all("#sha256=" in r for r in reqs)
    assert s.model.base.python == "python3.13" and "torch" not in s.unverified_pins()


# The wheels TheRock couples to this torch (by exact versions, but rocm-bootstrap), with the sha256s
# of the public manifest the stack file names (cp313, Linux x86_64), and the `rocm` sdist.
COUPLED = {
    "amd-torch-device-gfx1151": ("2.13.0+rocm10.0.0", "33dfb69b1d6d89127aec416d2891b205ed31d7ffb0a106aa45a54da7afd0c01d"),
    "amd-torch-device-gfx115x": ("2.13.0+rocm10.0.0", "44b27db9d540e589f2b17a78ca227a832f70c95ff7f476927507fbda92b524e5"),
    "rocm": ("10.0.0", "65b5982249612a310135f5e061b9f28909e8ad718a1ddb3f1abba92298b7216b"),
    "rocm-bootstrap": ("0.1.0", "33e3d4dad086b1f0e06bc049a618ca874d4fb72f758fff00676e23d2a644b652"),
    "amd-torchvision-device-gfx1151": ("0.28.0+rocm10.0.0",
                                       "847738fbb85db7e3cd6e711565a314bd145e71bb15f3b9271004b9821d18f234"),
    "triton": ("3.8.0+git4cff872c.rocm10.0.0", "874f41046c50f84392c8481f074a2f96cfc1dc44a9b05e162246cb7f9175e588"),
    "rocm-sdk-core": ("10.0.0", "3bf4a72d11aa2a4ee1e90572c73630f937d38c1b7af4dda45b483b54655138a7"),
    "rocm-sdk-libraries": ("10.0.0", "bbe83a550cb8ceeb306abf6d57df6617857a1b19384549526db2ec81a4374e57"),
    "rocm-sdk-device-gfx1151": ("10.0.0", "ec705df531e523777a5cd47b2dfadb2272935927c46c122effb11fcdcedb73d0"),
}


def test_the_whole_coupled_rocm_set_is_installed_by_url_and_sha256():
    """Not only torch/torchvision/torchaudio: their device wheels, triton and rocm-sdk-* too, so
    pip takes none of the ROCm set from an index (where +rocm7.x sorts above +rocm10.0.0)."""
    from packaging.utils import canonicalize_name, parse_sdist_filename, parse_wheel_filename
    from urllib.parse import unquote

    s = load_stack("gfx1151-rocm10.0")
    reqs = install_requirements(s)
    by_name = {r.split(" @ ", 1)[0].split("[", 1)[0]: r.split(" @ ", 1)[1] for r in reqs if " @ " in r}
    assert len(by_name) == len(reqs)  # every one by URL, none by version from an index
    assert set(by_name) == {"torch", "torchvision", "torchaudio", *COUPLED}
    for name, (version, sha) in COUPLED.items():
        url, _, got = by_name[name].partition("#sha256=")
        # The URL form the manifest fetched (whl-next/<name>/), not pytorch/whl-next/ (no record shows it).
        assert got == sha and url.startswith(f"https://stable.repo.amd.com/rocm/whl-next/{name}/"), name
        file = unquote(url.rsplit("/", 1)[1])
        dist, v = parse_sdist_filename(file) if file.endswith(".tar.gz") else parse_wheel_filename(file)[:2]
        assert dist == canonicalize_name(name) and str(v) == version
        assert s.pins()[f"{name}.wheel_sha256"] == sha  # part of the image tag
    # The torch step of the image installs exactly these.
    step = render_dockerfile(s)
    step = step[step.index("# torch 2.13.0+rocm10.0.0"):]
    for name, (_, sha) in COUPLED.items():
        assert f"'{name} @ https://" in step and f"#sha256={sha}'" in step, name


SHA_A = "a" * 64


@pytest.mark.parametrize("name,ref,why", [
    ("triton", "https://x.example/triton-3.8.0%2Bgit4cff872c.rocm10.0.0-cp313-cp313-linux_x86_64.whl#sha256=",
     "expected 'https://<wheel URL>#sha256=<64 hex>'"),  # an empty hash (no '#sha256=' at all: first use)
    ("rocm-sdk-core", f"http://x.example/rocm_sdk_core-10.0.0-py3-none-linux_x86_64.whl#sha256={SHA_A}",
     "expected 'https://<wheel URL>#sha256=<64 hex>'"),  # not https
    ("rocm-sdk-core", f"https://x.example/rocm_sdk_core-10.0.0-py3-none-linux_x86_64.whl#sha256={'a' * 63}",
     "expected 'https://<wheel URL>#sha256=<64 hex>'"),
    ("triton", f"https://x.example/triton-3.8.0%2Bgit4cff872c.rocm7.15.0a20260728-cp313-cp313-linux_x86_64.whl"
               f"#sha256={SHA_A}", "not *.rocm10.0.0 of torch's +rocm10.0.0 line"),  # the sort trap's 7.x
    ("rocm-sdk-libraries", f"https://x.example/rocm_sdk_libraries-7.15.0a20260728-py3-none-linux_x86_64.whl"
                           f"#sha256={SHA_A}", "not 10.0.0 of torch's +rocm10.0.0 line"),
    ("amd-torch-device-gfx1151", f"https://x.example/amd_torch_device_gfx1151-2.14.0%2Brocm10.0.0-cp313-cp313-"
                                 f"linux_x86_64.whl#sha256={SHA_A}", "not 2.13.0+rocm10.0.0 of torch's"),
    ("rocm-sdk-core", f"https://x.example/rocm_sdk_libraries-10.0.0-py3-none-linux_x86_64.whl#sha256={SHA_A}",
     "the wheel is rocm-sdk-libraries's, not rocm-sdk-core's"),
    ("rocm", f"https://x.example/rocm-7.15.0a20260728.tar.gz#sha256={SHA_A}", "not 10.0.0 of torch's +rocm10.0.0"),
    ("rocm", f"https://x.example/rocm-10.0.0-py3-none-any.whl#sha256={SHA_A}",
     "expected 'https://<sdist URL>.tar.gz#sha256=<64 hex>'"),  # AMD ships it as an sdist only
    ("amd-torch-device-gfx115x", f"https://x.example/amd_torch_device_gfx115x-0.0.1.dev0-py3-none-any.whl"
                                 f"#sha256={SHA_A}", "not 2.13.0+rocm10.0.0 of torch's"),  # PyPI's placeholder
    ("numpy", f"https://x.example/numpy-2.0.0-cp313-cp313-linux_x86_64.whl#sha256={SHA_A}",
     "names no package this block pins"),
])
def test_a_coupled_wheel_without_https_and_sha256_on_the_line_is_refused(tmp_path, name, ref, why):
    p = tmp_path / "s.yaml"
    p.write_text(f"extends: gfx1151-rocm10.0\ntorch:\n  wheels:\n    {name}: {ref}\n")
    r = subprocess.run([sys.executable, "-m", "toolbox", "render", "--stack", str(p)], cwd=ROOT,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "Traceback" not in r.stderr and r.stdout == ""
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert f"{p}:4: torch.wheels.{name}: " in r.stderr and why in r.stderr, r.stderr


def test_another_torch_drops_the_coupled_pins_it_would_contradict():
    # --set torch.torch moves torch: its wheel URL and the ones coupled to it are of the old build.
    s = load_stack("gfx1151-rocm10.0", ["torch.torch=2.13.1+rocm10.0.0"])
    assert set(s.model.torch.wheels) == {"torchvision", "torchaudio", "amd-torchvision-device-gfx1151"}


def test_rccl_is_built_from_the_releases_own_commit_without_a_series():
    stage = rccl_stage(render_dockerfile(load_stack("gfx1151-rocm10.0")))
    assert "git-fetch.sh https://github.com/ROCm/rocm-systems 6b0e43f341195e203754e08f850e437ff2fc09f9" in stage
    assert "apply-patches.sh" not in stage and "-DFAULT_INJECTION=OFF" in stage
    assert "-DEXPLICIT_ROCM_VERSION=10.0.0" in stage


@pytest.mark.parametrize("name", [n for n in stack_names() if load_stack(n).model.rccl is not None])
def test_every_rccl_build_without_8484_has_fault_injection_off(name):
    s = load_stack(name)
    stage = rccl_stage(render_dockerfile(s))
    if s.model.rccl.commit not in HAS_8484:
        assert s.model.rccl.fault_injection is False
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


def test_bitsandbytes_on_10_1_is_built_from_its_pinned_source_for_the_images_hip():
    """ROCm 10.1's HIP (7.16) has no released bitsandbytes library: the stack builds tag 0.50.1's
    commit with the HIP backend for gfx1151 against the image's ROCm, and the image build reads
    torch.version.hip and fails unless bitsandbytes picks and loads the exact library for it
    (scripts/bnb-check.py, run for real by tests/test_bnb_source.py)."""
    s = load_stack("gfx1151-rocm10.1")
    b = s.model.bitsandbytes
    assert (b.source, b.commit, b.version) == ("git", "37d2a9387f7146ccb85517ff45c665d345bfda79", "0.50.1")
    assert s.model.rocm.hip_version is None and rocm_library(s) is None
    text = render_dockerfile(s)
    stage = text[text.index("FROM devel AS bitsandbytes-build"):]
    stage = stage[:stage.index("\nFROM ")]
    assert f"git-fetch.sh https://github.com/bitsandbytes-foundation/bitsandbytes {b.commit} /src/bitsandbytes" in stage
    assert "build-bitsandbytes.sh /src/bitsandbytes /wheels/bitsandbytes \\\n      -DCOMPUTE_BACKEND=hip -DBNB_ROCM_ARCH=\"gfx1151\"" in stage
    assert "HIPCXX=/opt/rocm/llvm/bin/clang++" in stage
    runtime = text[text.index("COPY --from=bitsandbytes-build"):]
    runtime = runtime[:runtime.index("# Hugging Face stack")]
    assert "bitsandbytes-0.50.1-*.whl" in runtime
    # HIP is read in the build: no --hip, and no other HIP's library named
    assert "bnb-check.py\n" in runtime and "--hip" not in runtime and "rocm715" not in runtime
    assert "bitsandbytes==" not in text  # nothing from PyPI
    assert s.pins()["bitsandbytes.commit"] == b.commit
    # a stack that says its HIP passes it to the check, which then also holds torch to it
    pinned = load_stack("gfx1151-rocm10.1", ["rocm.hip_version=7.16"])
    assert rocm_library(pinned) == "libbitsandbytes_rocm716.so"
    assert "bnb-check.py --hip 7.16" in render_dockerfile(pinned)


def test_bitsandbytes_library_follows_hip_not_the_rocm_release():
    s = load_stack("gfx1151-rocm10.0")
    assert s.model.rocm.hip == "7.15" and rocm_library(s) == "libbitsandbytes_rocm715.so"
    assert rocm_library(load_stack("gfx1151-rocm7.14")) == "libbitsandbytes_rocm714.so"
    text = render_dockerfile(s)
    assert "bitsandbytes==0.50.2" in text and "bitsandbytes-build" not in text
    assert "55348a9a4a21bfd99cf8c7b32fe67b4030ae5c2a05738e03c1747f65fa6ec283 /tmp/bnb/bitsandbytes-0.50.2-" in text
    # The build asks bitsandbytes which library it picks for torch's HIP, and fails on another one.
    assert "env -u BNB_ROCM_VERSION /opt/venv/bin/python /opt/toolbox/scripts/bnb-check.py --hip 7.15" in text


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
