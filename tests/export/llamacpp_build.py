"""Build llama.cpp's tools for the host tests, once, into a cache folder reused across runs.

Source: the `llama-cpp-python` sdist from PyPI (pinned by version and sha256, the cpu stack's
llama_cpp pin), which vendors a whole llama.cpp tree. Only the programs export/evaluate run are
built (ccache keeps rebuilds cheap); the result has the image's /opt/llama.cpp layout:
bin/, convert_hf_to_gguf.py, conversion/, gguf-py/, plus models/ggml-vocab-*.gguf for the tests.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path

VERSION = "0.3.36"
SHA256 = "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"
TARGETS = ("llama-quantize", "llama-perplexity", "llama-completion",
           "llama-mtmd-cli")  # a vision export answers an image prompt (test_vision_export.py); llama-cli: the image test
CACHE = Path(os.environ.get("TOOLBOX_TEST_CACHE", Path.home() / ".cache" / "toolbox-tests"))
ROOT = CACHE / f"llama.cpp-{VERSION}"
VENDOR = "vendor/llama.cpp/"
KEEP = ("convert_hf_to_gguf.py", "conversion", "gguf-py", "models")


def _log(msg: str) -> None:
    print(f"[llama.cpp build] {msg}", file=sys.stderr, flush=True)


def _sdist(dl: Path, no_binary: str = ":all:") -> Path:
    """The pinned sdist in `dl`, downloaded (pip's --no-binary `no_binary`) unless there, checked by its sha256."""
    f = dl / f"llama_cpp_python-{VERSION}.tar.gz"
    if not f.is_file():
        dl.mkdir(parents=True, exist_ok=True)
        req = dl / "req.txt"
        req.write_text(f"llama-cpp-python=={VERSION} --hash=sha256:{SHA256}\n")
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary", no_binary,
                        "--require-hashes", "-r", str(req), "-d", str(dl)], check=True)
    digest = hashlib.sha256(f.read_bytes()).hexdigest()
    if digest != SHA256:
        f.unlink()
        raise RuntimeError(f"{f}: sha256 {digest}, pinned {SHA256}")
    return f


def _extract(sdist: Path, dest: Path) -> None:
    with tarfile.open(sdist) as tf:
        members = []
        for m in tf.getmembers():
            _, _, rest = m.name.partition("/")
            if rest.startswith(VENDOR) and not rest.endswith("/.git"):  # a submodule's gitdir link
                m.name = rest[len(VENDOR):]
                members.append(m)
        tf.extractall(dest, members=members, filter="data")


def ensure_source() -> Path:
    """The llama.cpp source tree (downloaded and extracted on first use, nothing built): the
    converter (convert_hf_to_gguf.py, conversion/, gguf-py/) and the vocabularies in models/."""
    src = ROOT / "src"
    if (src / "CMakeLists.txt").is_file():
        return src
    ROOT.mkdir(parents=True, exist_ok=True)
    with open(ROOT / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # parallel sessions wait for one download
        if not (src / "CMakeLists.txt").is_file():
            tmp = ROOT / "src.partial"
            shutil.rmtree(tmp, ignore_errors=True)
            _extract(_sdist(ROOT / "download"), tmp)
            shutil.rmtree(src, ignore_errors=True)
            os.replace(tmp, src)
    return src


def _complete(tools: Path) -> bool:
    """Built, with every program of TARGETS (a cache from before a target was added is built again)."""
    return (tools / "VERSION").is_file() and all((tools / "bin" / t).is_file() for t in TARGETS)


def ensure_tools() -> Path:
    """The tools folder (built on first use; later calls return at once)."""
    tools = ROOT / "tools"
    if _complete(tools):
        return tools
    src = ensure_source()
    with open(ROOT / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # parallel sessions wait for one build
        if _complete(tools):
            return tools
        t0 = time.time()
        env = dict(os.environ, CCACHE_DIR=str(CACHE / "ccache"), CCACHE_BASEDIR=str(ROOT))
        build = ROOT / "build"
        gen = ["-G", "Ninja"] if shutil.which("ninja") else []
        # No network at build time: no HTTPS client, no prebuilt web UI download.
        subprocess.run(["cmake", "-S", str(src), "-B", str(build), *gen, "-DCMAKE_BUILD_TYPE=Release",
                        "-DBUILD_SHARED_LIBS=OFF", "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF",
                        "-DLLAMA_BUILD_APP=OFF", "-DLLAMA_OPENSSL=OFF", "-DLLAMA_USE_PREBUILT_UI=OFF",
                        "-DLLAMA_BUILD_UI=OFF", "-DGGML_NATIVE=ON", "-DGGML_CCACHE=ON"],
                       check=True, env=env, stdout=subprocess.DEVNULL)
        _log(f"building {', '.join(TARGETS)} (first run only; ccache in {CACHE / 'ccache'})")
        subprocess.run(["cmake", "--build", str(build), "-j", str(os.cpu_count() or 2), "--target", *TARGETS],
                       check=True, env=env, stdout=subprocess.DEVNULL)
        tmp = ROOT / "tools.partial"
        shutil.rmtree(tmp, ignore_errors=True)
        (tmp / "bin").mkdir(parents=True)
        for t in TARGETS:
            shutil.copy2(build / "bin" / t, tmp / "bin" / t)
        for k in KEEP:
            (shutil.copytree if (src / k).is_dir() else shutil.copy2)(src / k, tmp / k)
        (tmp / "VERSION").write_text(f"llama-cpp-python {VERSION} sdist (sha256 {SHA256})\n")
        shutil.rmtree(tools, ignore_errors=True)  # an older build, without a target added since
        os.replace(tmp, tools)
        _log(f"built in {time.time() - t0:.0f} s")
    return tools


if __name__ == "__main__":
    print(ensure_tools())
