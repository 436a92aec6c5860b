"""The stack schema: pydantic models that forbid unknown keys, one description per field.

Validation only (the checks of single values are toolbox.stack.values): reading the YAML
(lines, `extends:`, `--set`) is toolbox.stack.source, and what is derived from a valid stack
(patch files, pins, digest) is toolbox.stack.resolved and toolbox.stack.digest.
`python -c 'import json, toolbox.stack.model as m; print(json.dumps(m.StackModel.model_json_schema()))'`
prints the schema with these descriptions.
"""

from __future__ import annotations

import re
from typing import Literal, Optional

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from toolbox.stack.values import (  # noqa: F401  (the patterns: re-exported)
    COMMIT_RE, DIGEST_RE, FLOATING_WORDS, KNOWN_GPU_TARGETS, SHA256_RE, VERSION_RE, FieldError,
    check_commit as _commit, check_sha256 as _sha256, check_targets as _targets, check_url as _url,
    check_version as _version, check_wheel_ref, covers as _covers, pinned_is_verified as _pinned_is_verified,
    GFX_RE as _GFX,
)


class Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Base(Model):
    image: str = Field(description='base image with a release tag, e.g. registry.fedoraproject.org/fedora:43 (no floating tags)')
    digest: Optional[str] = Field(None, description='manifest digest sha256:<64 hex> the image is pulled by; `toolbox bump base` resolves it')
    family: Literal["fedora", "debian"] = Field(description='OS family: picks the package manager and package names')
    python: str = Field("python3", description="the base's interpreter the /opt/venv is made with (fedora; debian always uses python3)")
    unverified: bool = Field(False, description='true while the digest is not pinned: `toolbox build` then pins it on first use (a set digest counts as verified)')
    _verified = _pinned_is_verified("digest")

    @field_validator("image")
    @classmethod
    def _image(cls, v: str) -> str:
        name, _, tag = v.rpartition(":")
        if "/" in tag or not name or not tag:
            raise ValueError(f"must name a tag, like fedora:43, got {v!r}")
        if tag.lower() in FLOATING_WORDS:
            raise ValueError(f"tag {tag!r} floats; name a release tag and pin a digest")
        return v

    @field_validator("digest")
    @classmethod
    def _digest(cls, v: str | None) -> str | None:
        if v is not None and not DIGEST_RE.match(v):
            raise ValueError(f"must be sha256:<64 hex>, got {v!r}")
        return v

    @property
    def ref(self) -> str:
        return f"{self.image}@{self.digest}" if self.digest else self.image


class Tarball(Model):
    url: str = Field(description='http(s) URL of a TheRock dist tarball')
    sha256: Optional[str] = Field(None, description="the tarball's sha256, checked in the build before extracting")
    unverified: bool = Field(False, description='true while sha256 is unknown: `toolbox build` then pins it on first use (a set sha256 counts as verified)')
    _verified = _pinned_is_verified("sha256")
    _u = field_validator("url")(classmethod(lambda cls, v: _url(v)))
    _s = field_validator("sha256")(classmethod(lambda cls, v: _sha256(v)))

    @model_validator(mode="after")
    def _hash_or_unverified(self) -> "Tarball":
        if self.sha256 is None and not self.unverified:
            raise ValueError("sha256 is required (or mark the pin `unverified: true`)")
        return self


class TheRockSource(Model):
    repo: str = Field(description="TheRock's git URL")
    commit: str = Field(description='40-hex commit of TheRock to build')
    components: list[str] = Field(description='THEROCK_ENABLE_<X> names to build (upper case)')
    unverified: bool = Field(False, description='true while the commit is not verified')
    _u = field_validator("repo")(classmethod(lambda cls, v: _url(v)))
    _c = field_validator("commit")(classmethod(lambda cls, v: _commit(v)))

    @field_validator("components")
    @classmethod
    def _sorted(cls, v: list[str]) -> list[str]:
        for c in v:
            if not re.match(r"^[A-Z0-9_]+$", c):
                raise ValueError(f"component {c!r} is not a THEROCK_ENABLE_<X> name (upper case)")
        return sorted(set(v))


class Rocm(Model):
    source: Literal["tarball", "source"] = Field(description='tarball: a TheRock release tarball; source: build TheRock from a commit')
    version: str = Field(description='ROCm version, exact (e.g. "7.13.0")')
    prefix: str = Field("/opt/rocm", description='where ROCm is installed in the image')
    tarball: Optional[Tarball] = Field(None, description='the tarball (source: tarball)')
    therock: Optional[TheRockSource] = Field(None, description='TheRock checkout (source: source)')
    hip_version: Optional[str] = Field(None, description="HIP's major.minor inside this ROCm where it differs from "
                                       "the ROCm version (ROCm 10.0.0 ships HIP 7.15): what torch.version.hip "
                                       "reports and bitsandbytes picks its library by; unset: the ROCm version's")
    _v = field_validator("version")(classmethod(lambda cls, v: _version(v)))

    @field_validator("hip_version")
    @classmethod
    def _hip(cls, v: str | None) -> str | None:
        if v is not None and not re.fullmatch(r"\d+\.\d+", str(v)):
            raise ValueError(f"must be HIP's major.minor as a quoted string, like \"7.15\", got {v!r}")
        return v

    @property
    def hip(self) -> str:
        """HIP's major.minor: hip_version, else the ROCm version's (7.x releases carry HIP 7.x)."""
        return self.hip_version or ".".join(self.version.split(".")[:2])

    @model_validator(mode="after")
    def _source_block(self) -> "Rocm":
        if self.source == "tarball" and self.tarball is None:
            raise ValueError("source: tarball needs a `tarball:` block (url, sha256)")
        if self.source == "source" and self.therock is None:
            raise ValueError("source: source needs a `therock:` block (repo, commit, components)")
        return self


class Rccl(Model):
    repo: str = Field(description='git URL of the repository holding RCCL (ROCm/rocm-systems)')
    # None only while unverified: the build then cannot fetch RCCL at all.
    commit: Optional[str] = Field(None, description='40-hex commit of that repository; None only while unverified')
    subdir: str = Field("projects/rccl", description="RCCL's folder inside the repository")
    patches: Optional[str] = Field(None, description='a patch series folder (with a quilt-style `series` file), relative to the stack file or the project')
    # None: the stack's gpu_targets, so another target is one field for the whole stack.
    gpu_targets: Optional[list[str]] = Field(None, description="targets RCCL is built for; unset: the stack's gpu_targets")
    enable_smi: bool = Field(False, description='build RCCL with amd-smi support')
    build_rccl_tests: bool = Field(False, description='also build rccl-tests (all_reduce_perf, ...) for `rccl-check`')
    fault_injection: Optional[bool] = Field(None, description="RCCL's FAULT_INJECTION cmake option: false builds with "
                                            "-DFAULT_INJECTION=OFF (TheRock#7903: multi-node collectives of 64-512 MB "
                                            "run far slower with it compiled in); unset: RCCL's own default (ON)")
    unverified: bool = Field(False, description='true while the commit is not verified')
    _u = field_validator("repo")(classmethod(lambda cls, v: _url(v)))
    _c = field_validator("commit")(classmethod(lambda cls, v: None if v is None else _commit(v)))
    _t = field_validator("gpu_targets")(classmethod(lambda cls, v: None if v is None else _targets(v)))

    @field_validator("gpu_targets")
    @classmethod
    def _nonempty(cls, v: list[str] | None) -> list[str] | None:
        if v is not None and not v:
            raise ValueError("must name at least one target (an empty list silently builds gfx906)")
        return v

    @model_validator(mode="after")
    def _commit_or_unverified(self) -> "Rccl":
        if self.commit is None and not self.unverified:
            raise ValueError("commit is required (or mark the block `unverified: true`)")
        return self


class Torch(Model):
    index_url: Optional[str] = Field(None, description="pip index the torch wheels come from (e.g. AMD's per-target index)")
    torch: str = Field(description='exact torch version, local tag included (e.g. "2.11.0+rocm7.13.0")')
    torchvision: Optional[str] = Field(None, description='exact torchvision version, or unset to leave it out')
    torchaudio: Optional[str] = Field(None, description='exact torchaudio version, or unset to leave it out')
    multi_arch: bool = Field(False, description="index_url has TheRock's multi-arch layout (whl-multi-arch/, ROCm 7.14 on): "
                             "torch and torchvision are installed with a [device-<target>] extra per gpu_target, which "
                             "adds amd-torch-device-<target> and rocm-sdk-device-<target> (the GPU code)")
    unverified: bool = Field(False, description='true while these versions are not verified against the index')
    wheels: dict[str, str] = Field(default_factory=dict, description="wheel files of index_url pinned on first use "
                                   "(`toolbox build` records them in the user's pins file): package -> "
                                   "'<wheel URL>#sha256=<64 hex>'; installed by that URL, and pip checks the hash. "
                                   "Also the wheels coupled to torch by exact versions (triton, rocm-sdk-core, "
                                   "rocm-sdk-libraries, amd-torch-device-<target>, amd-torchvision-device-<target>, "
                                   "rocm-sdk-device-<target>): 'https://...#sha256=<64 hex>' on torch's +rocm<X> line, "
                                   "so pip takes none of the ROCm set from an index")
    _v = field_validator("torch", "torchvision", "torchaudio")(
        classmethod(lambda cls, v: None if v is None else _version(v))
    )
    _u = field_validator("index_url")(classmethod(lambda cls, v: None if v is None else _url(v)))

    @model_validator(mode="after")
    def _wheels(self) -> "Torch":
        for name, ref in self.wheels.items():
            pinned = getattr(self, name, None) if name in ("torch", "torchvision", "torchaudio") else None
            check_wheel_ref(name, ref, pinned, self.torch, self.torchvision)
        return self


class Bitsandbytes(Model):
    source: Literal["git", "pypi"] = Field("git", description='git: built from `commit` for the stack\'s targets (HIP backend); '
                                           "pypi: the released manylinux wheel, whose ROCm builds cover the stack's ROCm")
    repo: str = Field("https://github.com/bitsandbytes-foundation/bitsandbytes", description='bitsandbytes git URL')
    commit: Optional[str] = Field(None, description='40-hex commit to build (source: git)')
    version: str = Field(description='the version: the wheel built (source: git) or installed (source: pypi)')
    wheel_sha256: Optional[str] = Field(None, description="sha256 of the manylinux x86_64 wheel (source: pypi), checked in the build")
    unverified: bool = Field(False, description='true while the commit (git) or the wheel sha256 (pypi) is not verified')
    _u = field_validator("repo")(classmethod(lambda cls, v: _url(v)))
    _c = field_validator("commit")(classmethod(lambda cls, v: None if v is None else _commit(v)))
    _v = field_validator("version")(classmethod(lambda cls, v: _version(v)))
    _s = field_validator("wheel_sha256")(classmethod(lambda cls, v: _sha256(v)))

    @model_validator(mode="after")
    def _source_fields(self) -> "Bitsandbytes":
        if self.source == "git":
            if self.commit is None:
                raise ValueError("source: git needs `commit` (40-hex)")
            if self.wheel_sha256 is not None:
                raise ValueError("wheel_sha256 belongs to source: pypi")
        else:
            if self.commit is not None:
                raise ValueError("source: pypi installs the released wheel: set `commit: null`")
            if self.wheel_sha256 is None and not self.unverified:
                raise ValueError("source: pypi needs `wheel_sha256` (or mark the block `unverified: true`)")
        return self


class PatchRef(Model):
    """A patch applied to a source tree: a file in the repo, or an upstream diff by URL + sha256."""

    file: Optional[str] = Field(None, description='a patch file, relative to the stack file or the project')
    url: Optional[str] = Field(None, description='an upstream diff URL (needs sha256)')
    sha256: Optional[str] = Field(None, description="the sha256 of the diff behind url")
    _s = field_validator("sha256")(classmethod(lambda cls, v: _sha256(v)))

    @model_validator(mode="after")
    def _one(self) -> "PatchRef":
        if (self.file is None) == (self.url is None):
            raise ValueError("give exactly one of `file` or `url`")
        if self.url is not None:
            _url(self.url)
            if self.sha256 is None:
                raise ValueError("a patch by url needs its sha256")
        return self


class Unsloth(Model):
    source: Literal["git", "pypi"] = Field(description='git: wheels built from pinned commits (patches applied); pypi: released versions')
    version: str = Field(description='unsloth version (names its wheel with source: git)')
    zoo_version: str = Field(description='unsloth_zoo version')
    repo: str = Field("https://github.com/unslothai/unsloth", description='unsloth git URL')
    commit: Optional[str] = Field(None, description='40-hex unsloth commit (source: git)')
    zoo_repo: str = Field("https://github.com/unslothai/unsloth-zoo", description='unsloth-zoo git URL')
    zoo_commit: Optional[str] = Field(None, description='40-hex unsloth-zoo commit (source: git)')
    extras: list[str] = Field(default_factory=list, description='unsloth extras to install, e.g. [huggingfacenotorch]')
    patches: list[PatchRef] = Field(default_factory=list, description='patches applied to unsloth before its wheel is built (source: git)')
    unverified: bool = Field(False, description='true while the pins are not verified')
    _v = field_validator("version", "zoo_version")(classmethod(lambda cls, v: _version(v)))
    _c = field_validator("commit", "zoo_commit")(classmethod(lambda cls, v: None if v is None else _commit(v)))

    @model_validator(mode="after")
    def _git_needs_commits(self) -> "Unsloth":
        if self.source == "git" and (self.commit is None or self.zoo_commit is None):
            raise ValueError("source: git needs `commit` and `zoo_commit` (40-hex)")
        if self.source == "pypi" and self.patches:
            raise ValueError("patches apply to a source: git build; source: pypi installs the released wheels")
        return self


class Hf(Model):
    transformers: str = Field(description='exact transformers version')
    trl: str = Field(description='exact trl version')
    peft: str = Field(description='exact peft version')
    accelerate: str = Field(description='exact accelerate version')
    datasets: str = Field(description='exact datasets version')
    _v = field_validator("transformers", "trl", "peft", "accelerate", "datasets")(
        classmethod(lambda cls, v: _version(v))
    )


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


class Ray(Model):
    # Its own block (not an hf pin): ~600 MB of dependencies that only multi-node users need.
    version: str = Field(description="ray[train] version: added to the stack's Python lock and installed in a "
                         "layer of its own after the training stack, for `launch --launcher ray`")
    _v = field_validator("version")(classmethod(lambda cls, v: _version(v)))


class Image(Model):
    title: str = Field("toolbox", description='image title; the label gets -<stack name> appended')
    description: str = Field("", description="OCI description label (default: the stack's description)")
    source: str = Field("https://github.com/toolbox/toolbox", description='OCI source label')
    licenses: str = Field("Apache-2.0", description='OCI licenses label')
    vendor: str = Field("toolbox", description='OCI vendor label')


class StackModel(Model):
    name: str = Field(description="stack name: lower case letters, digits, '.', '_' or '-'; part of the image tag")
    description: str = Field("", description='one line saying what the stack is for')
    platform: Literal["rocm", "cuda", "cpu"] = Field(description='rocm, cuda or cpu: which blocks below apply')
    base: Base = Field(description='the base image')
    gpu_targets: list[str] = Field(default_factory=list, description='AMD GPU targets (platform rocm only), e.g. [gfx1151]')
    rocm: Optional[Rocm] = Field(None, description='ROCm (platform rocm only)')
    rccl: Optional[Rccl] = Field(None, description='RCCL built from source with a patch series (platform rocm only)')
    torch: Torch = Field(description='PyTorch')
    bitsandbytes: Optional[Bitsandbytes] = Field(None, description='bitsandbytes built from source (platform rocm only)')
    unsloth: Optional[Unsloth] = Field(None, description='Unsloth and unsloth_zoo')
    hf: Hf = Field(description='the Hugging Face training libraries')
    llama_cpp: Optional[LlamaCpp] = Field(None, description="llama.cpp's tools and GGUF converter (export/evaluate)")
    ray: Optional[Ray] = Field(None, description="Ray Train for `launch --launcher ray` (unset: the image has no Ray)")
    image: Image = Field(default_factory=Image, description='OCI labels')
    _t = field_validator("gpu_targets")(classmethod(lambda cls, v: _targets(v)))

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not re.match(r"^[a-z0-9][a-z0-9._-]*$", v):
            raise ValueError(f"must be lower case letters, digits, '.', '_' or '-', got {v!r}")
        return v

    @model_validator(mode="after")
    def _platform(self) -> "StackModel":
        if self.platform == "rocm":
            if self.rocm is None:
                raise FieldError(("platform",), "platform rocm needs a `rocm:` block")
            if not self.gpu_targets:
                raise FieldError(("platform",), "platform rocm needs gpu_targets (e.g. [gfx1151])")
            if self.rccl is not None and self.rccl.gpu_targets is not None:
                extra = sorted(set(self.rccl.gpu_targets) - set(self.gpu_targets))
                if extra:
                    raise FieldError(("rccl", "gpu_targets"),
                                     f"rccl.gpu_targets names {', '.join(extra)}, which gpu_targets does not "
                                     "(drop rccl.gpu_targets to follow gpu_targets)")
            stale = [(name, url) for name, url in (
                ("rocm.tarball.url", self.rocm.tarball.url if self.rocm.source == "tarball" else None),
                ("torch.index_url", self.torch.index_url)) if url and not _covers(url, self.gpu_targets)]
            if stale:
                names = " and ".join(n for n, _ in stale)
                built = ", ".join(sorted({t for _, u in stale for t in _GFX.findall(u)}))
                raise FieldError(("gpu_targets",), f"{names} {'are' if len(stale) > 1 else 'is'} for {built}, "
                                 f"not gpu_targets {', '.join(self.gpu_targets)}: set {names} for "
                                 f"{', '.join(self.gpu_targets)} too (a tarball URL without its sha256 is "
                                 "pinned on first use)")
            self._one_rocm_line()
        else:
            for key in ("rocm", "rccl"):
                if getattr(self, key) is not None:
                    raise FieldError((key,), f"`{key}:` only belongs to platform rocm")
            if self.gpu_targets:
                raise FieldError(("gpu_targets",), "gpu_targets only belongs to platform rocm")
        l = self.llama_cpp
        if l is not None and l.backend != "cpu" and l.backend != {"rocm": "hip", "cuda": "cuda"}.get(self.platform):
            raise FieldError(("llama_cpp", "backend"), f"backend {l.backend} does not fit platform {self.platform}")
        return self

    def _one_rocm_line(self) -> None:
        """From ROCm 10 on, AMD's indexes hold 7.x and 10.x builds side by side, and pip/uv compare
        local versions as text: +rocm10.0.0 sorts below +rocm7.15.0a... (TheRock
        docs/packaging/versioning.md, #7183). So a torch pin that is not one exact build of this
        ROCm line (+rocm<major>.<minor>.<patch>) could install a 7.x wheel into a 10.x image: refused."""
        major = re.match(r"(\d+)\.(\d+)", self.rocm.version)
        if not self.torch.index_url or major is None or int(major[1]) < 10:
            return
        line = f"{major[1]}.{major[2]}"
        for key in ("torch", "torchvision", "torchaudio"):
            v = getattr(self.torch, key)
            if v is None:
                continue
            local = v.partition("+")[2]
            m = re.fullmatch(r"rocm(\d+)\.(\d+)\.\d+", local)
            if m and f"{m[1]}.{m[2]}" == line:
                continue
            why = "has no local version" if not local else f"names +{local}"
            raise FieldError(("torch", key), f"{v} {why}: on ROCm {self.rocm.version} pin one exact build of "
                             f"its line, +rocm{line}.<patch> (a 7.x wheel sorts above a 10.x one as text, so "
                             "anything looser can install the wrong ROCm line)")
