"""llama.cpp: the GGUF converter and the programs export/evaluate run (llama-quantize,
llama-perplexity, llama-completion, llama-cli, llama-server), and llama-mtmd-cli, which runs the
vision GGUF + mmproj pair export-model writes for an image-text run; built in a builder stage
with ccache for the stack's accelerator and copied to /opt/llama.cpp in the runtime stage.

Source: git at a 40-hex commit, or the llama-cpp-python sdist from PyPI (version + sha256),
which vendors the whole llama.cpp tree, for builds that reach PyPI only (this project's CI).
"""

from typing import Literal, Optional

from pydantic import Field, field_validator, model_validator

from toolbox.components import Component, LockPart, Model
from toolbox.components.values import (
    FieldError, check_commit as _commit, check_sha256 as _sha256, check_url as _url, check_version
    as _version,
)

TARGETS = ("llama-quantize", "llama-perplexity", "llama-completion", "llama-cli", "llama-server", "llama-mtmd-cli")


def _pins(stack):
    l = stack.model.llama_cpp
    pins = {"llama_cpp.source": l.source, "llama_cpp.commit": l.commit, "llama_cpp.backend": l.backend,
            "llama_cpp.sentencepiece": l.sentencepiece}
    if l.source == "pypi":
        pins["llama_cpp.version"] = l.version
        pins["llama_cpp.sdist_sha256"] = l.sdist_sha256
    if l.backend == "hip":
        pins["llama_cpp.gpu_targets"] = ",".join(stack.model.gpu_targets)
    return pins


def cmake_flags(stack) -> list[str]:
    # Portable CPU code (AVX2/FMA/F16C baseline, not the build machine's), no HTTPS client and
    # no prebuilt web UI download (the build has no route to them), static programs.
    flags = ["-DCMAKE_BUILD_TYPE=Release", "-DBUILD_SHARED_LIBS=OFF", "-DGGML_NATIVE=OFF", "-DGGML_CCACHE=ON",
             "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF", "-DLLAMA_BUILD_APP=OFF",
             "-DLLAMA_OPENSSL=OFF", "-DLLAMA_USE_PREBUILT_UI=OFF", "-DLLAMA_BUILD_UI=OFF"]
    backend = stack.model.llama_cpp.backend
    if backend == "hip":
        flags += ["-DGGML_HIP=ON", f'-DGPU_TARGETS="{";".join(stack.model.gpu_targets)}"',
                  f"-DCMAKE_HIP_COMPILER={stack.model.rocm.prefix}/llvm/bin/clang"]
    elif backend == "cuda":
        flags += ["-DGGML_CUDA=ON"]
    return flags


# ggml's CPU backend is built with OpenMP (its default): the programs link GCC's libgomp, which
# slim base images lack ("libgomp.so.1: cannot open shared object file", seen in the cpu image).
RUNTIME_PACKAGES = {"debian": ["libgomp1"], "fedora": ["libgomp"]}


def _variables(stack, pin_set):
    return {"llama_cpp_flags": cmake_flags(stack), "llama_cpp_targets": list(TARGETS),
            "llama_cpp_packages": RUNTIME_PACKAGES[stack.model.base.family]}


def _checks(model) -> None:
    backend, platform = model.llama_cpp.backend, model.platform
    if backend != "cpu" and backend != {"rocm": "hip", "cuda": "cuda"}.get(platform):
        raise FieldError(("llama_cpp", "backend"), f"backend {backend} does not fit platform {platform}")


class LlamaCpp(Model):
    source: Literal["pypi", "git"] = Field(description="pypi: the llama-cpp-python sdist, which vendors a whole "
                                           "llama.cpp tree (reachable where only PyPI is); git: repo at commit")
    version: Optional[str] = Field(None, description="llama-cpp-python sdist version (source pypi)")
    sdist_sha256: Optional[str] = Field(None, description="sha256 of that sdist (source pypi)")
    repo: str = Field("https://github.com/ggml-org/llama.cpp", description="llama.cpp git URL (source git)")
    commit: str = Field(description="40-hex llama.cpp commit: what is built (git), or what the sdist vendors (pypi)")
    backend: Literal["cpu", "hip", "cuda"] = Field(description="ggml backend: hip (gpu_targets) on rocm, cuda on cuda, cpu")
    sentencepiece: str = Field(description="sentencepiece version: the converter imports it for every Llama model")
    _v = field_validator("version")(classmethod(lambda cls, v: None if v is None else _version(v)))
    _sp = field_validator("sentencepiece")(classmethod(lambda cls, v: _version(v)))
    _s = field_validator("sdist_sha256")(classmethod(lambda cls, v: _sha256(v)))
    _u = field_validator("repo")(classmethod(lambda cls, v: _url(v)))
    _c = field_validator("commit")(classmethod(lambda cls, v: _commit(v)))

    @model_validator(mode="after")
    def _source(self) -> "LlamaCpp":
        if self.source == "pypi":
            for key in ("version", "sdist_sha256"):
                if getattr(self, key) is None:
                    raise FieldError((key,), f"source pypi needs llama_cpp.{key}")
        return self


COMPONENT = Component(
    "llama_cpp", place=70,
    block=LlamaCpp, field=Field(None, description="llama.cpp's tools and GGUF converter (export/evaluate)"),
    applies=lambda s: s.model.llama_cpp is not None, pins=_pins,
    builder="stages/llama_cpp.j2", runtime="runtime/llama_cpp.j2",
    needs_devel=lambda s: True, variables=_variables, checks=_checks,
    # llama.cpp's converter imports sentencepiece: in the Python lock
    lock=lambda s: LockPart(requirements=(f"sentencepiece=={s.model.llama_cpp.sentencepiece}",)
                            if s.model.llama_cpp.sentencepiece else ()),
)
