"""toolbox/rccl/hipcheck.py (the image's one-HIP-runtime check) on real ELF shared objects built
here with gcc, loaded by a real process: two ROCm builds side by side (an "sdk" folder, like torch's
rocm-sdk wheels, whose HIP finds its HSA runtime by RUNPATH $ORIGIN, and an "opt" folder, like the
/opt/rocm tarball) and an RCCL that needs libamdhip64.so.7 by name. The good case is the image's
environment (ROCm's folder off LD_LIBRARY_PATH); the bad ones are the environment the image had
(LD_LIBRARY_PATH=/opt/rccl/lib:/opt/rocm/lib: the SDK's HIP gets the tarball's HSA runtime) and
RCCL loaded before torch's preload (two HIPs). Also on recorded /proc/self/maps files."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from toolbox.paths import PROJECT_ROOT

CHECK = PROJECT_ROOT / "toolbox" / "rccl" / "hipcheck.py"
pytestmark = pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc")


def _so(out: Path, soname: str, src: str, *link: str) -> Path:
    out.parent.mkdir(parents=True, exist_ok=True)
    c = out.with_suffix(".c")
    c.write_text(src)
    subprocess.run(["gcc", "-shared", "-fPIC", "-O1", f"-Wl,-soname,{soname}", "-o", str(out), str(c), *link],
                   check=True, capture_output=True)
    return out


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    root = tmp_path_factory.mktemp("rocm")
    for where in ("sdk", "opt"):
        hsa = _so(root / where / "libhsa-runtime64.so.1", "libhsa-runtime64.so.1", f'int hsa_init(void) {{ return {len(where)}; }}\n')
        _so(root / where / "libamdhip64.so.7", "libamdhip64.so.7",
            "int hsa_init(void);\nint hipInit(unsigned f) { return hsa_init() + (int)f; }\n",
            f"-L{hsa.parent}", "-l:libhsa-runtime64.so.1", "-Wl,--enable-new-dtags,-rpath,$ORIGIN")
    _so(root / "rccl" / "librccl.so.1", "librccl.so.1", "int hipInit(unsigned);\nint ncclGetVersion(int *v) { *v = hipInit(0); return 0; }\n",
        f"-L{root / 'opt'}", "-l:libamdhip64.so.7")
    return root


def run(*args: str, ld: str | None = None) -> subprocess.CompletedProcess:
    env = {"PATH": "/usr/bin:/bin", **({"LD_LIBRARY_PATH": ld} if ld else {})}
    return subprocess.run([sys.executable, str(CHECK), *args], capture_output=True, text=True, timeout=60, env=env)


def test_the_images_environment_maps_one_hip_and_says_which(tree):
    # torch's preload (the SDK's HIP by path), then RCCL by name: ROCm's folder only in the cache.
    r = run("--no-torch", "--preload", str(tree / "sdk" / "libamdhip64.so.7"), "--load", "librccl.so.1",
            ld=str(tree / "rccl"))
    assert r.returncode == 0, r.stderr
    assert f"HIP runtime: {tree / 'sdk' / 'libamdhip64.so.7'}" in r.stdout
    assert f"libhsa-runtime64: {tree / 'sdk' / 'libhsa-runtime64.so.1'}" in r.stdout


def test_rocm_on_ld_library_path_hands_the_sdks_hip_the_tarballs_hsa_runtime(tree):
    # The environment the image had: LD_LIBRARY_PATH=/opt/rccl/lib:/opt/rocm/lib comes before RUNPATH.
    r = run("--no-torch", "--preload", str(tree / "sdk" / "libamdhip64.so.7"), "--load", "librccl.so.1",
            ld=f"{tree / 'rccl'}:{tree / 'opt'}")
    assert r.returncode == 1
    assert f"libhsa-runtime64 mapped from {tree / 'opt' / 'libhsa-runtime64.so.1'}, not beside HIP in {tree / 'sdk'}" in r.stderr


def test_rccl_loaded_before_torch_maps_two_hips(tree):
    r = run("--no-torch", "--load", "librccl.so.1", "--preload", str(tree / "sdk" / "libamdhip64.so.7"),
            ld=f"{tree / 'rccl'}:{tree / 'opt'}")
    assert r.returncode == 1
    assert "2 HIP runtimes mapped in one process" in r.stderr
    assert str(tree / "opt" / "libamdhip64.so.7") in r.stderr and str(tree / "sdk" / "libamdhip64.so.7") in r.stderr


def test_no_hip_at_all_is_a_failure(tree):
    r = run("--no-torch")
    assert r.returncode == 1 and "no libamdhip64 is mapped" in r.stderr


MAPS = """\
7f0000000000-7f0000001000 r--p 00000000 08:01 11 /opt/venv/lib/python3.13/site-packages/_rocm_sdk_core/lib/libamdhip64.so.7.15.26333
7f0000001000-7f0000002000 r-xp 00001000 08:01 11 /opt/venv/lib/python3.13/site-packages/_rocm_sdk_core/lib/libamdhip64.so.7.15.26333
7f0000003000-7f0000004000 r--p 00000000 08:01 12 /opt/venv/lib/python3.13/site-packages/_rocm_sdk_core/lib/libamd_comgr.so.3
7f0000005000-7f0000006000 r--p 00000000 08:01 13 /opt/rccl/lib/librccl.so.1.0
7fff00000000-7fff00001000 rw-p 00000000 00:00 0 [stack]
"""


@pytest.mark.parametrize("extra,ok,said", [
    ("", True, "HIP runtime: /opt/venv/lib/python3.13/site-packages/_rocm_sdk_core/lib/libamdhip64.so.7.15.26333"),
    ("7f0000007000-7f0000008000 r--p 00000000 08:01 14 /opt/rocm/lib/libamdhip64.so.7.15.26333\n", False,
     "2 HIP runtimes mapped"),
    ("7f0000007000-7f0000008000 r--p 00000000 08:01 15 /opt/rocm/lib/libamd_comgr.so.3 (deleted)\n", False,
     "libamd_comgr mapped from"),
])
def test_recorded_maps(tmp_path, extra, ok, said):
    p = tmp_path / "maps"
    p.write_text(MAPS + extra)
    r = run("--maps", str(p))
    assert r.returncode == (0 if ok else 1) and said in (r.stdout + r.stderr), r.stdout + r.stderr


def test_bad_arguments_exit_2(tmp_path):
    assert run("--maps", str(tmp_path / "none")).returncode == 2
    assert run("--no-torch", "--load").returncode == 2
