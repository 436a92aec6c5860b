"""The RCCL part of the rendered gfx1151 Dockerfiles says what the issue asks of it."""

from __future__ import annotations

import re

import pytest

from toolbox.rendering import render_dockerfile
from toolbox.stack.load import load_stack


def _rccl_stage(text: str) -> str:
    start = text.index("FROM devel AS rccl-build")
    return text[start:text.index("\nFROM ", start + 1)]


@pytest.mark.parametrize("name,commit,series,smi", [
    ("gfx1151", "79e85e1468f96a867108043c953e9547c13b4c5e", "rccl-patches/gfx1151", "OFF"),
    ("gfx1151-early2026", "0f191289ffadcebdb65391c5d9ddacccfbffae36", "rccl-patches/gfx1151-early2026", "OFF"),
])
def test_stage_flags(name, commit, series, smi):
    stack = load_stack(name)
    assert stack.model.rccl.commit == commit and not stack.model.rccl.unverified
    text = render_dockerfile(stack)
    stage = _rccl_stage(text)
    assert f"git-fetch.sh https://github.com/ROCm/rocm-systems {commit} /src/rocm-systems" in stage
    assert f"apply-patches.sh /src/rocm-systems --series /src/{series}" in stage
    # explicit, never empty (an empty list falls back to gfx906), for RCCL and rccl-tests alike
    assert stage.count('-DGPU_TARGETS="gfx1151"') == 2
    for flag in ("-DBUILD_TESTS=OFF", "-DGENERATE_SYM_KERNELS=OFF", f"-DENABLE_AMDSMI={smi}",
                 "-DCMAKE_CXX_COMPILER_LAUNCHER=ccache", f"-DEXPLICIT_ROCM_VERSION={stack.model.rocm.version}"):
        assert flag in stage, flag
    assert stage.count("--mount=type=cache,target=/root/.ccache") == 2
    assert "projects/rccl-tests" in stage  # both stacks build rccl-tests
    # runtime: ours first on the path, every other librccl linked to it, then the two checks, in order
    rt = text[text.index("FROM base AS runtime"):]
    i_copy = rt.index("COPY --from=rccl-build /opt/rccl /opt/rccl")
    i_torch = rt.index("pip.sh install")
    i_link = rt.index("-name 'librccl.so*'")
    i_abi = rt.index("rccl-abi-check.py")
    i_import = rt.index('"librccl" in l')
    i_hip = rt.index("hip-runtime-check.py --load librccl.so.1")
    assert i_copy < i_torch < i_link < i_abi < i_import < i_hip
    assert "--provider /opt/rccl/lib/librccl.so.1" in rt and "libtorch_hip.so" in rt
    # ROCm's own folder is in the loader's cache, not on LD_LIBRARY_PATH (one HIP runtime: hipcheck.py)
    assert re.search(r"ENV LD_LIBRARY_PATH=/opt/rccl/lib\n", rt) and not any("/opt/rocm" in m for m in re.findall(r"LD_LIBRARY_PATH=\S*", rt))
    assert "echo /opt/rocm/lib > /etc/ld.so.conf.d/toolbox-rocm.conf && ldconfig" in rt


def test_stack_fields_drive_the_stage():
    text = render_dockerfile(load_stack("gfx1151", ["rccl.enable_smi=true", "rccl.build_rccl_tests=false"]))
    stage = _rccl_stage(text)
    assert "-DENABLE_AMDSMI=ON" in stage
    assert "rccl-tests" not in stage


@pytest.mark.parametrize("field", ["enable_smi", "build_rccl_tests"])
def test_rccl_build_switches_change_the_tag(field):
    """An image with SMI linked (or rccl-tests built) is another image: another lock digest and label."""
    base = load_stack("gfx1151")
    flipped = load_stack("gfx1151", [f"rccl.{field}={str(not getattr(base.model.rccl, field)).lower()}"])
    assert flipped.digest() != base.digest()
    assert flipped.pins()[f"rccl.{field}"] != base.pins()[f"rccl.{field}"]
