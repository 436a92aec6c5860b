#!/bin/sh
# build-bitsandbytes.sh SRC WHEELDIR -DCOMPUTE_BACKEND=hip|cpu [CMAKE_ARG...]: bitsandbytes' native
# library from the source tree SRC (its own CMakeLists.txt: hip takes -DBNB_ROCM_ARCH=<gfx;...>
# and the ROCm of ROCM_PATH / PATH), then its wheel into WHEELDIR.
# The image's builder stage and the host test (tests/test_bnb_source.py) both run this, so CI
# proves the same recipe. CMake puts the library into SRC/bitsandbytes/, named for the HIP that
# hipconfig reports (libbitsandbytes_rocm<major><minor>.so) or _cpu; the wheel step then skips
# setup.py's own CMake run (BNB_SKIP_CMAKE=1, as bitsandbytes' release workflow does), which
# would otherwise configure the default CPU backend again. $PIP runs pip (default: python3 -m pip).
# Env: BNB_BUILD_DIR (default SRC/build), CMAKE_HIP_COMPILER_LAUNCHER (ccache), HIPCXX.
set -eu
usage="usage: build-bitsandbytes.sh SRC WHEELDIR -DCOMPUTE_BACKEND=hip|cpu [CMAKE_ARG...]"
[ $# -ge 3 ] || { echo "$usage" >&2; exit 2; }
# An absolute path: pip reads a bare relative name ("src") as a package on the index.
src=$(cd "$1" && pwd) wheels=$2
shift 2
case "$1" in
  -DCOMPUTE_BACKEND=hip)
    case "$*" in *-DBNB_ROCM_ARCH=?*) ;; *) echo "build-bitsandbytes.sh: the hip backend needs -DBNB_ROCM_ARCH=<targets>" >&2; exit 2 ;; esac
    want="libbitsandbytes_rocm$(hipconfig --version | sed -E 's/^([0-9]+)\.([0-9]+).*/\1\2/').so" ;;
  -DCOMPUTE_BACKEND=cpu) want=libbitsandbytes_cpu.so ;;
  *) echo "$usage" >&2; exit 2 ;;
esac
build=${BNB_BUILD_DIR:-$src/build}
gen=""
command -v ninja >/dev/null 2>&1 && gen="-GNinja"
cmake -S "$src" -B "$build" $gen -DCMAKE_BUILD_TYPE=Release "$@"
cmake --build "$build"
[ -f "$src/bitsandbytes/$want" ] || {
  echo "build-bitsandbytes.sh: the build made no $src/bitsandbytes/$want (it made: $(cd "$src/bitsandbytes" && ls libbitsandbytes* 2>/dev/null | tr '\n' ' '))" >&2
  exit 1
}
echo "build-bitsandbytes.sh: built $want"
BNB_SKIP_CMAKE=1 ${PIP:-python3 -m pip} wheel --no-deps --wheel-dir "$wheels" "$src"
