"""bitsandbytes from the pinned source the ROCm 10.1 image builds (issue 47), for real on this host.

The same commit (gfx1151-rocm10.1's bitsandbytes.commit) is fetched by the image's own
git-fetch.sh, configured and built by the image's own build-bitsandbytes.sh (its CPU backend:
no HIP compiler for gfx1151 is on this machine's registries, see below), packed as a wheel,
installed, imported, and checked by the image's own bnb-check.py, which runs a 4-bit layer
through the built library. The build runs once and is cached by commit
(TOOLBOX_TEST_CACHE, default ~/.cache/toolbox-tests/bitsandbytes-<commit>-cpu/).
bnb-check.py's refusals run on gfx1151-rocm10.0's own PyPI wheel (by its pinned sha256, cached
the same way), with torch.version.hip set as a HIP torch reports it (the host's torch is a CPU
build: that version string is the one thing faked).

Where the source comes from: the stack's GitHub repository, which this machine and CI cannot
reach. No registry reachable here has that source: PyPI's bitsandbytes sdists stop at 0.42.0
(2024-01, before bitsandbytes' CMake build; every later release is wheels only), and Debian and
npm have no bitsandbytes. So the build runs where TOOLBOX_BNB_GIT names a git repository (a path
or URL) holding the commit, and is skipped, saying so, elsewhere. The HIP backend is not built
here: Debian bookworm's hipcc is 5.2.3 on clang 15, whose AMDGPU targets end at gfx1103 (gfx1151
came with LLVM 17), and Debian has no hipblas, hiprand or hipblaslt, which its CMake requires.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from toolbox.paths import PROJECT_ROOT
from toolbox.stack.load import load_stack

STACK = "gfx1151-rocm10.1"
SCRIPTS = PROJECT_ROOT / "dockerfiles" / "scripts"
CACHE = Path(os.environ.get("TOOLBOX_TEST_CACHE", Path.home() / ".cache" / "toolbox-tests"))


def _pin():
    return load_stack(STACK).model.bitsandbytes


def _run(cmd, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=1200, **kw)


@pytest.fixture(scope="session")
def bnb_site() -> Path:
    """A folder holding bitsandbytes built from the pinned commit (CPU backend), installed with
    --target: the test's Python (CPU torch) imports it through PYTHONPATH."""
    b = _pin()
    repo = os.environ.get("TOOLBOX_BNB_GIT")
    if not repo:
        pytest.skip(f"bitsandbytes {b.version} @ {b.commit}: the pinned source is on no registry reachable here "
                    "(PyPI's bitsandbytes sdists end at 0.42.0, Debian and npm have none) and its repository "
                    "is not reachable: set TOOLBOX_BNB_GIT to a git repository holding that commit")
    root = CACHE / f"bitsandbytes-{b.commit}-cpu"
    site, done = root / "site", root / "DONE"
    root.mkdir(parents=True, exist_ok=True)
    with open(root.parent / f".{root.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one build, whichever test process gets here first
        if not done.is_file():
            for d in ("src", "wheels", "site"):
                shutil.rmtree(root / d, ignore_errors=True)
            t0 = time.monotonic()
            env = {**os.environ, "PIP": f"{sys.executable} -m pip"}
            for cmd in (["sh", SCRIPTS / "git-fetch.sh", repo, b.commit, root / "src"],
                        ["sh", SCRIPTS / "build-bitsandbytes.sh", root / "src", root / "wheels", "-DCOMPUTE_BACKEND=cpu"],
                        None):
                if cmd is None:  # the wheel's file name is known once it is built
                    cmd = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", site,
                           *sorted((root / "wheels").glob("*.whl"))]
                r = _run(cmd, env=env)
                assert r.returncode == 0, f"{cmd[:2]} failed:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
            done.write_text(f"{b.commit} built in {time.monotonic() - t0:.0f} s\n")
            print(f"[bitsandbytes build] {done.read_text().strip()}", file=sys.stderr)
    return site


def _check(site: Path, *args: str, hip: str | None = None) -> subprocess.CompletedProcess:
    """bnb-check.py with `site` first on sys.path; `hip`: torch.version.hip as a HIP build of torch
    reports it (this host's torch is a CPU build: the one thing faked, by a sitecustomize)."""
    path = [str(site)]
    if hip:
        shim = site.parent / f"hip-{hip}"
        shim.mkdir(exist_ok=True)
        (shim / "sitecustomize.py").write_text(f"import torch\ntorch.version.hip = {hip!r}\n")
        path.insert(0, str(shim))
    env = {k: v for k, v in os.environ.items() if k != "BNB_ROCM_VERSION"}
    env["PYTHONPATH"] = os.pathsep.join(path)
    return _run([sys.executable, SCRIPTS / "bnb-check.py", *args], env=env)


def _said(r: subprocess.CompletedProcess) -> list[str]:
    """The check's own lines (bitsandbytes logs its own on stderr too)."""
    return [l for l in r.stderr.splitlines() if l.startswith("bnb-check: ")]


def test_pinned_source_builds_installs_and_runs_a_4bit_layer(bnb_site):
    b = _pin()
    assert _run(["git", "-C", bnb_site.parent / "src", "rev-parse", "HEAD"]).stdout.strip() == b.commit
    wheels = [p.name for p in (bnb_site.parent / "wheels").glob("*.whl")]
    assert len(wheels) == 1 and wheels[0].startswith(f"bitsandbytes-{b.version}-"), wheels
    libs = sorted(p.name for p in (bnb_site / "bitsandbytes").glob("libbitsandbytes*"))
    assert libs == ["libbitsandbytes_cpu.so"]  # what this build made, and nothing prebuilt
    r = _check(bnb_site)
    assert r.returncode == 0, r.stderr
    line = r.stdout.strip().splitlines()[-1]
    assert line.startswith(f"bitsandbytes {b.version}: {bnb_site / 'bitsandbytes' / 'libbitsandbytes_cpu.so'} (CPU);")
    assert "4-bit layer on the CPU: max error" in line


@pytest.fixture(scope="session")
def wheel_site() -> Path:
    """gfx1151-rocm10.0's bitsandbytes: PyPI's manylinux wheel by its pinned sha256 (rocm64 to
    rocm715 libraries and a CPU one), installed with --target; cached by version."""
    b = load_stack("gfx1151-rocm10.0").model.bitsandbytes
    root = CACHE / f"bitsandbytes-{b.version}-pypi"
    site = root / "site"
    root.mkdir(parents=True, exist_ok=True)
    with open(root.parent / f".{root.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (root / "DONE").is_file():
            shutil.rmtree(site, ignore_errors=True)
            req = root / "req.txt"
            req.write_text(f"bitsandbytes=={b.version} --hash=sha256:{b.wheel_sha256}\n")
            r = _run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--only-binary", ":all:",
                      "--require-hashes", "-r", req, "--target", site])
            assert r.returncode == 0, r.stderr[-3000:]
            (root / "DONE").write_text(b.wheel_sha256 + "\n")
    return site


def _copy(site: Path, tmp_path: Path) -> Path:
    out = tmp_path / "site"
    shutil.copytree(site, out, symlinks=True)
    return out


def test_check_passes_the_10_0_wheel_on_cpu_torch(wheel_site):
    """The check the image runs, on the 10.0 image's own bitsandbytes: a CPU torch picks the CPU
    library, and a 4-bit layer runs through it."""
    r = _check(wheel_site)
    assert r.returncode == 0, r.stderr
    assert "(CPU); 4-bit layer on the CPU: max error" in r.stdout


def test_check_refuses_the_10_0_wheel_on_hip_7_16(wheel_site):
    """ROCm 10.1's case with a wheel: torch reports HIP 7.16, the wheel has no rocm716 library and
    bitsandbytes would fall back to 7.15's with only a warning; the build stops, naming both."""
    r = _check(wheel_site, hip="7.16.26385")
    assert r.returncode == 1 and _said(r) == [
        "bnb-check: bitsandbytes 0.50.2 has no libbitsandbytes_rocm716.so for HIP 7.16.26385 (it picked "
        "libbitsandbytes_rocm715.so): pin a bitsandbytes with that build, or build it from source"]
    r = _check(wheel_site, "--hip", "7.16", hip="7.15.26333")
    assert r.returncode == 1 and _said(r) == ["bnb-check: torch.version.hip is 7.15.26333, the stack says HIP 7.16"]
    # 7.15's library is the exact one; it links ROCm's libraries, which this host lacks (the image has them)
    r = _check(wheel_site, "--hip", "7.15", hip="7.15.26333")
    lib = wheel_site / "bitsandbytes" / "libbitsandbytes_rocm715.so"
    assert r.returncode == 1 and len(_said(r)) == 1 and _said(r)[0].startswith(f"bnb-check: cannot load {lib}: ")


def test_check_refuses_a_missing_library_and_missing_entry_points(wheel_site, tmp_path):
    site = _copy(wheel_site, tmp_path)
    pkg = site / "bitsandbytes"
    (pkg / "libbitsandbytes_cpu.so").rename(tmp_path / "cpu.so")
    r = _check(site)
    assert r.returncode == 1 and _said(r) == [
        "bnb-check: bitsandbytes 0.50.2 has no libbitsandbytes_cpu.so for CPU torch "
        "(it picked libbitsandbytes_cpu.so, absent): pin a bitsandbytes with that build, or build it from source"]
    # The exact HIP library's name on a build without the GPU entry points: no GPU here, so the
    # check looks them up, and they are missing.
    (tmp_path / "cpu.so").rename(pkg / "libbitsandbytes_rocm715.so")
    r = _check(site, "--hip", "7.15", hip="7.15.26333")
    assert r.returncode == 1 and _said(r) == [
        f"bnb-check: {pkg / 'libbitsandbytes_rocm715.so'} lacks cquantize_blockwise_bf16_nf4, "
        "cdequantize_blockwise_bf16_nf4, cgemm_4bit_inference_naive_bf16"]


def test_build_script_refuses_bad_arguments_and_a_build_without_the_library(tmp_path):
    """build-bitsandbytes.sh: one line and exit 2 for what it cannot build; exit 1, naming what was
    made, when CMake made no library of the expected name (here: a tree whose CMakeLists builds none)."""
    script = SCRIPTS / "build-bitsandbytes.sh"
    src = tmp_path / "src"
    (src / "bitsandbytes").mkdir(parents=True)
    usage = "usage: build-bitsandbytes.sh SRC WHEELDIR -DCOMPUTE_BACKEND=hip|cpu [CMAKE_ARG...]"
    for args, said in (([], usage), ([src, tmp_path / "w", "-DCOMPUTE_BACKEND=cuda"], usage),
                       ([src, tmp_path / "w", "-DCOMPUTE_BACKEND=hip"],
                        "build-bitsandbytes.sh: the hip backend needs -DBNB_ROCM_ARCH=<targets>")):
        r = _run(["sh", script, *args])
        assert r.returncode == 2 and r.stderr.strip().splitlines() == [said], r.stderr
    (src / "CMakeLists.txt").write_text("cmake_minimum_required(VERSION 3.16)\nproject(nothing NONE)\n")
    (src / "bitsandbytes" / "libbitsandbytes_cuda130.so").write_text("")  # made, but not what the backend makes
    r = _run(["sh", script, src, tmp_path / "w", "-DCOMPUTE_BACKEND=cpu"], env={**os.environ, "BNB_BUILD_DIR": str(tmp_path / "b")})
    assert r.returncode == 1
    assert r.stderr.strip().splitlines()[-1] == (f"build-bitsandbytes.sh: the build made no {src}/bitsandbytes/"
                                                 "libbitsandbytes_cpu.so (it made: libbitsandbytes_cuda130.so )")
    assert not (tmp_path / "w").exists()  # no wheel step
