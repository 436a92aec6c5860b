"""llama.cpp: the GGUF converter and the programs export/evaluate run (llama-quantize,
llama-perplexity, llama-completion, llama-cli, llama-server), built in a builder stage with
ccache for the stack's accelerator and copied to /opt/llama.cpp in the runtime stage.

Source: git at a 40-hex commit, or the llama-cpp-python sdist from PyPI (version + sha256),
which vendors the whole llama.cpp tree, for builds that reach PyPI only (this project's CI).
"""

from toolbox.components import Component

TARGETS = ("llama-quantize", "llama-perplexity", "llama-completion", "llama-cli", "llama-server")


def _pins(stack):
    l = stack.llama_cpp
    pins = {"llama_cpp.source": l.source, "llama_cpp.commit": l.commit, "llama_cpp.backend": l.backend,
            "llama_cpp.sentencepiece": l.sentencepiece}
    if l.source == "pypi":
        pins["llama_cpp.version"] = l.version
        pins["llama_cpp.sdist_sha256"] = l.sdist_sha256
    if l.backend == "hip":
        pins["llama_cpp.gpu_targets"] = ",".join(stack.gpu_targets)
    return pins


def cmake_flags(stack) -> list[str]:
    # Portable CPU code (AVX2/FMA/F16C baseline, not the build machine's), no HTTPS client and
    # no prebuilt web UI download (the build has no route to them), static programs.
    flags = ["-DCMAKE_BUILD_TYPE=Release", "-DBUILD_SHARED_LIBS=OFF", "-DGGML_NATIVE=OFF", "-DGGML_CCACHE=ON",
             "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF", "-DLLAMA_BUILD_APP=OFF",
             "-DLLAMA_OPENSSL=OFF", "-DLLAMA_USE_PREBUILT_UI=OFF", "-DLLAMA_BUILD_UI=OFF"]
    backend = stack.llama_cpp.backend
    if backend == "hip":
        flags += ["-DGGML_HIP=ON", f'-DGPU_TARGETS="{";".join(stack.gpu_targets)}"',
                  f"-DCMAKE_HIP_COMPILER={stack.rocm.prefix}/llvm/bin/clang"]
    elif backend == "cuda":
        flags += ["-DGGML_CUDA=ON"]
    return flags


# ggml's CPU backend is built with OpenMP (its default): the programs link GCC's libgomp, which
# slim base images lack ("libgomp.so.1: cannot open shared object file", seen in the cpu image).
RUNTIME_PACKAGES = {"debian": ["libgomp1"], "fedora": ["libgomp"]}


def _variables(stack, pin_set):
    return {"llama_cpp_flags": cmake_flags(stack), "llama_cpp_targets": list(TARGETS),
            "llama_cpp_packages": RUNTIME_PACKAGES[stack.base.family]}


COMPONENT = Component(
    "llama_cpp", applies=lambda s: s.llama_cpp is not None, pins=_pins,
    builder="stages/llama_cpp.j2", runtime="runtime/llama_cpp.j2",
    needs_devel=lambda s: True, variables=_variables,
)
