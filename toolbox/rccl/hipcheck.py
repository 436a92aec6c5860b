"""One HIP runtime per training process: which libamdhip64 does `import torch` plus the collective
library map, and is it the only one?

The runtime image holds two ROCm builds of one release: TheRock's tarball in /opt/rocm (the
compiler RCCL, llama.cpp and bitsandbytes are built with) and the rocm-sdk wheels torch loads its
libraries from. Two HIP runtimes in one process, or one HIP with another build's HSA runtime or
COMGR, is what the gfx1151 10.0.0 tarball report shows failing: its HIP fails hipStreamCreate with
a COMGR link error reported as out-of-memory, where the rocm-sdk wheels' HIP works ("ROCm 10 Spike
- Build Works, Runtime Does Not", 2026-09-04; lyogavin/airllm docs/rocm.md runs torch on gfx1151 on
the wheels; TheRock #7426, the same error with the 7.14.0 tarball on gfx942).

The image build runs this after `import torch` (which preloads the SDK's HIP, COMGR and RCCL by
path, TheRock external-builds/pytorch/build_prod_wheels.py LINUX_LIBRARY_PRELOADS) and loading
librccl as a collective would: exactly one libamdhip64 may be mapped, and the HSA runtime and
COMGR, where mapped, from the same folder; it prints which. Also runs on a recorded maps file.

    hip-runtime-check.py [--no-torch] [--preload PATH | --load NAME]...   (in the order given)
    hip-runtime-check.py --maps FILE
exit 0: one runtime (printed); 1: more than one, or none; 2: bad arguments.
"""

from __future__ import annotations

import ctypes
import os
import re
import sys

HIP = "libamdhip64"
# Loaded by HIP itself: a copy from another build beside the SDK's HIP is the mix the reports fail on.
COMPANIONS = ("libhsa-runtime64", "libamd_comgr")
_LIB = re.compile(r"^(lib[A-Za-z0-9_+-]+)\.so(\.\d+)*$")


def mapped(maps_text: str) -> dict[str, set[str]]:
    """{library stem: the files mapped} for HIP and its companions, from /proc/<pid>/maps text."""
    out: dict[str, set[str]] = {}
    for line in maps_text.splitlines():
        parts = line.split(None, 5)
        if len(parts) < 6 or not parts[5].startswith("/"):
            continue
        path = parts[5].removesuffix(" (deleted)")
        m = _LIB.match(os.path.basename(path))
        if m and m.group(1) in (HIP, *COMPANIONS):
            out.setdefault(m.group(1), set()).add(path)
    return out


def judge(maps_text: str) -> tuple[bool, list[str]]:
    """(one runtime?, the lines to print): the HIP runtime mapped, or what is wrong with it."""
    libs = mapped(maps_text)
    hips = sorted(libs.get(HIP, ()))
    if not hips:
        return False, [f"hip-runtime-check: no {HIP} is mapped: nothing loaded HIP (is this torch a ROCm build?)"]
    if len(hips) > 1:
        return False, [f"hip-runtime-check: {len(hips)} HIP runtimes mapped in one process: {', '.join(hips)}; "
                       "fix: one ROCm's libraries on the search path (LD_LIBRARY_PATH), torch imported first"]
    folder = os.path.dirname(hips[0])
    lines, ok = [f"hip-runtime-check: HIP runtime: {hips[0]}"], True
    for stem in COMPANIONS:
        files = sorted(libs.get(stem, ()))
        if not files:
            continue
        if len(files) > 1 or os.path.dirname(files[0]) != folder:
            ok = False
            lines.append(f"hip-runtime-check: {stem} mapped from {', '.join(files)}, not beside HIP in {folder}: "
                         "HIP with another ROCm build's runtime; fix: take that ROCm's folder off LD_LIBRARY_PATH")
        else:
            lines.append(f"hip-runtime-check: {stem}: {files[0]}")
    return ok, lines


def main(argv: list[str]) -> int:
    if argv[:1] == ["--maps"]:
        if len(argv) != 2:
            print("hip-runtime-check: --maps takes one file", file=sys.stderr)
            return 2
        try:
            text = open(argv[1], encoding="utf-8").read()
        except OSError as exc:
            print(f"hip-runtime-check: {argv[1]}: {exc.strerror}", file=sys.stderr)
            return 2
    else:
        torch = True
        if argv[:1] == ["--no-torch"]:
            torch, argv = False, argv[1:]
        if len(argv) % 2 or any(a not in ("--preload", "--load") for a in argv[::2]):
            print("hip-runtime-check: usage: [--no-torch] [--preload PATH | --load NAME]... | --maps FILE",
                  file=sys.stderr)
            return 2
        if torch:
            import torch.distributed  # noqa: F401  (what a training process imports before its first collective)
        for how, lib in zip(argv[::2], argv[1::2]):
            try:  # --preload: by path, as torch's _rocm_init does; --load: by name, as the loader finds it
                ctypes.CDLL(lib, mode=ctypes.RTLD_GLOBAL)
            except OSError as exc:
                print(f"hip-runtime-check: {how} {lib}: {exc}", file=sys.stderr)
                return 1
        with open("/proc/self/maps", encoding="utf-8") as f:
            text = f.read()
    ok, lines = judge(text)
    print("\n".join(lines), file=sys.stdout if ok else sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
