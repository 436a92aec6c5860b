"""Build the `.gpu/llama/` tarballs that docs/bench/export-call.sh carries to the device machine.

    python docs/bench/build_llama_tools.py OUTDIR        # -> OUTDIR/{llama-tools,sp-site,tok-llama-bpe}.tgz

From the pins the images and the host tests use, nothing else:
- llama-tools.tgz: llama.cpp from the llama-cpp-python sdist on PyPI (version + sha256 pinned in
  tests/export/llamacpp_build.py; it vendors the llama.cpp commit the cuda stack pins), CPU backend,
  static, built for any x86_64 with AVX2 (GGML_NATIVE off: the device's CPU is not this one), only
  llama-quantize, llama-perplexity and llama-completion, in the image's /opt/llama.cpp layout under tools/ (bin/,
  convert_hf_to_gguf.py, conversion/, gguf-py/, VERSION; not models/: 75 MB of test vocabularies);
- sp-site.tgz: sentencepiece at the stacks' llama_cpp.sentencepiece pin, the cp312 manylinux wheel
  unpacked (the device's Python is 3.12; the converter imports it even for BPE tokenizers);
- tok-llama-bpe.tgz: an HF tokenizer made from that tree's models/ggml-vocab-llama-bpe.gguf by
  tests/export/vocab.py and checked against the vendored token ids.
Needs cmake, a C++ compiler and pip's access to PyPI. Takes ~10 min on 2 cores (ccache-less).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests" / "export"))
import llamacpp_build  # noqa: E402  (the pinned sdist, its extraction: one place)
import vocab  # noqa: E402

TARGETS = ("llama-quantize", "llama-perplexity", "llama-completion")  # evaluate --runtime llama checks all three
PY_TAG = "cp312"  # the gpu-site's Python (3.12)


def _pin_sentencepiece() -> str:
    import yaml

    return str(yaml.safe_load((REPO / "toolbox" / "stacks" / "cuda.yaml").read_text())["llama_cpp"]["sentencepiece"])


def _sdist(dl: Path) -> Path:
    """The pinned sdist, checked by its sha256 (pip builds only its metadata; its build tools as wheels)."""
    return llamacpp_build._sdist(dl, no_binary="llama-cpp-python")


def build_tools(work: Path, out: Path) -> None:
    src = work / "src"
    if not (src / "CMakeLists.txt").is_file():
        llamacpp_build._extract(_sdist(work / "download"), src)
    build = work / "build"
    gen = ["-G", "Ninja"] if shutil.which("ninja") else []
    subprocess.run(["cmake", "-S", str(src), "-B", str(build), *gen, "-DCMAKE_BUILD_TYPE=Release",
                    "-DBUILD_SHARED_LIBS=OFF", "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF",
                    "-DLLAMA_BUILD_APP=OFF", "-DLLAMA_OPENSSL=OFF", "-DLLAMA_CURL=OFF",
                    "-DLLAMA_USE_PREBUILT_UI=OFF", "-DLLAMA_BUILD_UI=OFF",
                    "-DGGML_NATIVE=OFF", "-DGGML_AVX=ON", "-DGGML_AVX2=ON", "-DGGML_FMA=ON", "-DGGML_F16C=ON",
                    "-DGGML_OPENMP=OFF"],  # static binaries carried to another machine: no libgomp there
                   check=True, stdout=subprocess.DEVNULL)
    subprocess.run(["cmake", "--build", str(build), "-j", str(os.cpu_count() or 2), "--target", *TARGETS],
                   check=True, stdout=subprocess.DEVNULL)
    tools = work / "stage" / "tools"
    shutil.rmtree(tools.parent, ignore_errors=True)
    (tools / "bin").mkdir(parents=True)
    for t in TARGETS:
        shutil.copy2(build / "bin" / t, tools / "bin" / t)
    for k in llamacpp_build.KEEP:
        if k != "models":  # 75 MB of test vocabularies: the call carries at most 64 MiB (the tokenizer: below)
            (shutil.copytree if (src / k).is_dir() else shutil.copy2)(src / k, tools / k)
    (tools / "VERSION").write_text(f"llama-cpp-python {llamacpp_build.VERSION} sdist "
                                   f"(sha256 {llamacpp_build.SHA256}), CPU AVX2 static\n")
    with tarfile.open(out / "llama-tools.tgz", "w:gz") as tf:
        tf.add(tools, arcname="tools")


def build_sentencepiece(work: Path, out: Path) -> None:
    dl = work / "sp"
    subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary", ":all:",
                    "--python-version", "3.12", "--implementation", "cp", "--abi", PY_TAG,
                    *[a for tag in ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64",
                                    "manylinux2014_x86_64") for a in ("--platform", tag)],
                    f"sentencepiece=={_pin_sentencepiece()}", "-d", str(dl)],
                   check=True)
    site = work / "sp-site"
    shutil.rmtree(site, ignore_errors=True)
    for whl in dl.glob("sentencepiece-*.whl"):
        zipfile.ZipFile(whl).extractall(site)
    with tarfile.open(out / "sp-site.tgz", "w:gz") as tf:
        for p in site.iterdir():
            tf.add(p, arcname=p.name)


def build_tokenizer(work: Path, out: Path) -> None:
    gguf = work / "src" / "models" / "ggml-vocab-llama-bpe.gguf"
    dest = work / "tok-llama-bpe"
    shutil.rmtree(dest, ignore_errors=True)
    vocab.make_tokenizer(gguf, dest)
    n = vocab.check_against_vendored(dest, gguf)
    print(f"tok-llama-bpe: {n} vendored strings tokenized as llama.cpp expects", file=sys.stderr)
    with tarfile.open(out / "tok-llama-bpe.tgz", "w:gz") as tf:
        tf.add(dest, arcname="tok-llama-bpe")


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: build_llama_tools.py OUTDIR", file=sys.stderr)
        return 2
    out = Path(argv[0])
    out.mkdir(parents=True, exist_ok=True)
    work = Path(os.environ.get("LLAMA_BUILD_DIR") or tempfile.mkdtemp(prefix="llama-tools-"))
    work.mkdir(parents=True, exist_ok=True)
    build_tools(work, out)
    build_tokenizer(work, out)
    build_sentencepiece(work, out)
    for f in sorted(out.glob("*.tgz")):
        print(f"{f} {f.stat().st_size} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
