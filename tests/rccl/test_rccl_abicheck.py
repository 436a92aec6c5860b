"""toolbox/rccl/abicheck.py on real ELF shared objects compiled here with gcc.

The script runs under `python3 -S -I` (no site-packages) to prove it is stdlib-only,
as it must be inside the image.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
ABICHECK = ROOT / "toolbox" / "rccl" / "abicheck.py"

pytestmark = pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc")

FULL = r"""
int ncclCommInitRank(void) { return 0; }
int ncclAllReduce(void) { return 0; }
int ncclCommResume(void) { return 0; }
int rcclGetAlgoInfo(void) { return 0; }
__attribute__((weak)) int ncclWeakExport(void) { return 0; }
__attribute__((visibility("hidden"))) int ncclHiddenHelper(void) { return 1; }
int ncclUnusedExtra(void) { return ncclHiddenHelper(); }
"""

# Same library one release behind: no ncclCommResume (the symbol that broke `import torch`).
MISSING = FULL.replace("int ncclCommResume(void) { return 0; }\n", "")

CONSUMER = r"""
#include <stdio.h>
extern int ncclCommInitRank(void);
extern int ncclAllReduce(void);
extern int ncclCommResume(void);
extern int rcclGetAlgoInfo(void);
extern int ncclWeakExport(void);
extern int ncclOptionalFeature(void) __attribute__((weak));
int use_all(void) {
  puts("not an nccl symbol: ignored");
  int r = ncclCommInitRank() + ncclAllReduce() + ncclCommResume() + rcclGetAlgoInfo() + ncclWeakExport();
  if (ncclOptionalFeature) r += ncclOptionalFeature();
  return r;
}
"""

HIDDEN_CONSUMER = r"""
extern int ncclHiddenHelper(void);
int use_hidden(void) { return ncclHiddenHelper(); }
"""

NO_NCCL_CONSUMER = r"""
#include <stdio.h>
int hello(void) { return puts("hi"); }
"""


def _so(tmp: Path, name: str, src: str) -> Path:
    c = tmp / f"{name}.c"
    c.write_text(src)
    out = tmp / f"lib{name}.so"
    # Shared objects may keep undefined symbols: exactly what a consumer of librccl looks like.
    subprocess.run(["gcc", "-shared", "-fPIC", "-O1", "-o", str(out), str(c)], check=True)
    return out


def _run(*args: str | Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-S", "-I", str(ABICHECK), *map(str, args)],
                          capture_output=True, text=True, timeout=60)


@pytest.fixture(scope="module")
def libs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("abi")
    return {
        "full": _so(tmp, "rccl_full", FULL),
        "missing": _so(tmp, "rccl_missing", MISSING),
        "consumer": _so(tmp, "torch_hip_like", CONSUMER),
        "hidden": _so(tmp, "uses_hidden", HIDDEN_CONSUMER),
        "plain": _so(tmp, "plain", NO_NCCL_CONSUMER),
        "tmp": tmp,
    }


def test_provider_exporting_everything_passes(libs):
    r = _run("--provider", libs["full"], "--consumer", libs["consumer"])
    assert r.returncode == 0, r.stderr
    # ncclCommInitRank, ncclAllReduce, ncclCommResume, rcclGetAlgoInfo, ncclWeakExport, ncclOptionalFeature
    assert "OK: all 6 imported symbol(s)" in r.stdout
    # The weak import is optional for the consumer: reported, not fatal.
    assert "weak import ncclOptionalFeature" in r.stderr


def test_provider_missing_a_symbol_fails_and_names_it(libs):
    r = _run("--provider", libs["missing"], "--consumer", libs["consumer"])
    assert r.returncode == 1
    assert "FAIL" in r.stderr and "lacks 1 symbol(s)" in r.stderr
    assert "ncclCommResume" in r.stderr and str(libs["consumer"]) in r.stderr
    assert "ncclAllReduce" not in r.stderr  # present symbols are not listed


def test_hidden_symbol_does_not_count_as_exported(libs):
    r = _run("--provider", libs["full"], "--consumer", libs["hidden"])
    assert r.returncode == 1
    assert "ncclHiddenHelper" in r.stderr


def test_several_consumers_are_all_checked(libs):
    r = _run("--provider", libs["full"], "--consumer", libs["consumer"], "--consumer", libs["hidden"])
    assert r.returncode == 1
    assert "ncclHiddenHelper" in r.stderr and "ncclCommResume" not in r.stderr


def test_consumer_importing_nothing_is_an_error_unless_allowed(libs):
    r = _run("--provider", libs["full"], "--consumer", libs["plain"])
    assert r.returncode == 2 and "nothing was checked" in r.stderr
    r = _run("--provider", libs["full"], "--consumer", libs["plain"], "--allow-empty")
    assert r.returncode == 0


def test_bad_input_exits_2_naming_the_file(libs):
    not_elf = libs["tmp"] / "notes.txt"
    not_elf.write_text("not a library\n")
    r = _run("--provider", not_elf, "--consumer", libs["consumer"])
    assert r.returncode == 2 and f"{not_elf}: not an ELF file" in r.stderr
    r = _run("--provider", libs["tmp"] / "absent.so", "--consumer", libs["consumer"])
    assert r.returncode == 2 and "absent.so: cannot read" in r.stderr
    truncated = libs["tmp"] / "truncated.so"
    truncated.write_bytes(libs["full"].read_bytes()[:64])
    r = _run("--provider", truncated, "--consumer", libs["consumer"])
    assert r.returncode == 2 and "truncated.so" in r.stderr


def test_agrees_with_nm_when_available(libs):
    nm = shutil.which("nm")
    if nm is None:
        pytest.skip("binutils not installed")
    sys.path.insert(0, str(ABICHECK.parent))
    try:
        import abicheck  # noqa: PLC0415
    finally:
        sys.path.pop(0)
    syms = abicheck.read_dynsyms(libs["consumer"])
    out = subprocess.run([nm, "-D", "--undefined-only", str(libs["consumer"])],
                         capture_output=True, text=True, check=True).stdout
    nm_undef = {line.split()[-1].split("@")[0] for line in out.splitlines() if line.strip()}
    assert syms.imported | syms.imported_weak == nm_undef
    out = subprocess.run([nm, "-D", "--defined-only", str(libs["full"])],
                         capture_output=True, text=True, check=True).stdout
    nm_def = {line.split()[-1] for line in out.splitlines() if line.split()[1] in "TWDBRVu"}
    assert abicheck.read_dynsyms(libs["full"]).exported == nm_def


def test_real_torch_libraries():
    """The reader on a production-size ELF (libtorch_cpu.so, ~400 MB): libc10 satisfies its c10 imports."""
    torch = pytest.importorskip("torch")
    lib = Path(torch.__file__).parent / "lib"
    consumer, provider = lib / "libtorch_cpu.so", lib / "libc10.so"
    if not consumer.is_file() or not provider.is_file():
        pytest.skip("torch without libtorch_cpu.so/libc10.so")
    r = _run("--provider", provider, "--consumer", consumer, "--pattern", r"^_ZN3c10")
    assert r.returncode == 0, r.stderr
    # ...and a library that does not export them is caught.
    r = _run("--provider", libs_shm(lib), "--consumer", consumer, "--pattern", r"^_ZN3c10")
    assert r.returncode == 1 and "_ZN3c10" in r.stderr


def libs_shm(lib: Path) -> Path:
    shm = lib / "libshm.so"
    if not shm.is_file():
        pytest.skip("torch without libshm.so")
    return shm


def test_kyuz0_60_the_loader_fails_exactly_where_the_check_does(tmp_path):
    """The case of amd-strix-halo-vllm-toolboxes #60: a librccl.so.1 without ncclCommResume put
    where torch's libtorch_hip.so (linked against a newer one) finds it. The dynamic loader then
    refuses libtorch with `undefined symbol: ncclCommResume` (what `import torch` printed); the
    check refuses the same pair before that, naming the symbol, and passes the matching pair."""
    libs = {}
    for name, src in (("good", FULL), ("bad", MISSING)):
        d = tmp_path / name
        d.mkdir()
        (d / "rccl.c").write_text(src)
        libs[name] = d / "librccl.so.1"
        subprocess.run(["gcc", "-shared", "-fPIC", "-O1", "-Wl,-soname,librccl.so.1", "-o", str(libs[name]),
                        str(d / "rccl.c")], check=True)
        (d / "librccl.so").symlink_to("librccl.so.1")
    (tmp_path / "torch_hip.c").write_text(CONSUMER)
    consumer = tmp_path / "libtorch_hip.so"
    # Linked as torch's is: DT_NEEDED librccl.so.1, built against the full library.
    subprocess.run(["gcc", "-shared", "-fPIC", "-O1", "-o", str(consumer), str(tmp_path / "torch_hip.c"),
                    f"-L{tmp_path / 'good'}", "-lrccl"], check=True)

    def load(where: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-S", "-c", f"import ctypes; ctypes.CDLL({str(consumer)!r})"],
                              capture_output=True, text=True, timeout=60,
                              env={"LD_LIBRARY_PATH": str(tmp_path / where), "PATH": "/usr/bin:/bin"})

    assert load("good").returncode == 0
    bad = load("bad")
    assert bad.returncode != 0 and "undefined symbol: ncclCommResume" in bad.stderr, bad.stderr
    ok = _run("--provider", libs["good"], "--consumer", consumer)
    assert ok.returncode == 0, ok.stderr
    r = _run("--provider", libs["bad"], "--consumer", consumer)
    assert r.returncode == 1 and "ncclCommResume" in r.stderr, r.stderr
    assert "ncclCommInitRank" not in r.stderr and "ncclAllReduce" not in r.stderr  # exactly the missing one
