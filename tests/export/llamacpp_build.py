"""llama.cpp's tools for the host tests, built once into a cache folder reused across runs.

Source: the `llama-cpp-python` sdist from PyPI (pinned by version and sha256, the cpu stack's
llama_cpp pin), which vendors a whole llama.cpp tree. Only the programs export/evaluate run are
built; the result has the image's /opt/llama.cpp layout: bin/, convert_hf_to_gguf.py, conversion/,
gguf-py/, plus models/ggml-vocab-*.gguf for the tests.

Where podman answers they come from the cpu image's own llama.cpp builder stage (llama.cpp is
compiled once per run: that stage's build tree gets the few targets the image leaves out, in a
container of it, and the programs are copied out; the stage is Debian bookworm, as CI's host, and
the programs must run here or the host build below is used). Elsewhere: a host build (ccache).
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
STAGE_TAG = f"localhost/toolbox-test-llama-build:{VERSION}"  # the cpu stack's llama.cpp builder stage


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
        tmp = ROOT / "tools.partial"
        shutil.rmtree(tmp, ignore_errors=True)
        why = _from_image_stage(tmp) if shutil.which("podman") else "podman is not installed"
        if why:
            _log(f"{why}: building on the host")
            shutil.rmtree(tmp, ignore_errors=True)
            _host_build(src, tmp)
        shutil.rmtree(tools, ignore_errors=True)  # an older build, without a target added since
        os.replace(tmp, tools)
        _log(f"ready in {time.time() - t0:.0f} s: {(tools / 'VERSION').read_text().strip()}")
    return tools


def _from_image_stage(tmp: Path) -> str | None:
    """TARGETS from the cpu stack's llama.cpp builder stage (podman's layer cache holds it once the
    cpu image is built): its build tree, in a container, builds the targets the image leaves out
    (ninja: only what they add; ccache: podman's). None when done, else why not."""
    from helpers.enginekit import ca_bundle, podman, toolbox, wheelhouse
    from helpers.prebuilt import BUILD_TIMEOUT, CCACHE_TARGET, ensure_base_image, podman_ccache

    ensure_base_image()
    cp = toolbox("build", "--stack", "cpu", "--engine", "podman", "--target", "llama_cpp-build",
                 "--tag", STAGE_TAG, "--ca-bundle", str(ca_bundle()), "--wheelhouse", str(wheelhouse()),
                 timeout=BUILD_TIMEOUT)
    if cp.returncode != 0:
        return f"the cpu stack's llama_cpp-build stage did not build:\n{(cp.stdout + cp.stderr)[-3000:]}"
    tmp.mkdir(parents=True)
    cache = podman_ccache()
    script = (f"cmake --build /build/llama.cpp --target {' '.join(TARGETS)} >/dev/null"
              f" && cp {' '.join(f'/build/llama.cpp/bin/{t}' for t in TARGETS)} /out/bin/"
              f" && cp -r {' '.join(f'/src/llama.cpp/{k}' for k in KEEP)} /out/")
    (tmp / "bin").mkdir()
    run = podman("run", "--rm", "--network", "none", "-v", f"{tmp}:/out",
                 *(["-v", f"{cache}:{CCACHE_TARGET}"] if cache else []), STAGE_TAG, "sh", "-c", script, check=False)
    if run.returncode != 0:
        return f"building {', '.join(TARGETS)} in {STAGE_TAG} failed:\n{run.stderr[-3000:]}"
    for t in TARGETS:  # the stage is Debian bookworm: its programs must run on this host
        probe = subprocess.run([str(tmp / "bin" / t), "--help"], capture_output=True, text=True)
        if "error while loading shared libraries" in probe.stderr or "GLIBC" in probe.stderr:
            return f"{t} from the image stage does not run here: {probe.stderr.strip()[-300:]}"
    (tmp / "VERSION").write_text(f"llama-cpp-python {VERSION} sdist (sha256 {SHA256}), "
                                 f"built in the cpu stack's llama_cpp-build stage ({STAGE_TAG})\n")
    return None


def _host_build(src: Path, tmp: Path) -> None:
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
    (tmp / "bin").mkdir(parents=True)
    for t in TARGETS:
        shutil.copy2(build / "bin" / t, tmp / "bin" / t)
    for k in KEEP:
        (shutil.copytree if (src / k).is_dir() else shutil.copy2)(src / k, tmp / k)
    (tmp / "VERSION").write_text(f"llama-cpp-python {VERSION} sdist (sha256 {SHA256}), built on the host\n")


if __name__ == "__main__":
    print(ensure_tools())
