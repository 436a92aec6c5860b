"""Stacks: the YAML files of pins that a Dockerfile is rendered from.

A stack is validated by pydantic models that forbid unknown keys, so a typo such as
`rocm.verison` is an error naming the file, the field path and the line. A user's file can
`extends:` a shipped stack; `--set key.path=value` overrides go through the same validation.
"""

from __future__ import annotations

import copy
import hashlib
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Optional, Sequence

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError, field_validator, model_validator

from toolbox.errors import UserError

PACKAGE_DIR = Path(__file__).resolve().parent
STACKS_DIR = PACKAGE_DIR / "stacks"
PROJECT_ROOT = PACKAGE_DIR.parent
DEFAULT_STACK = "gfx1151"

COMMIT_RE = re.compile(r"^[0-9a-f]{40}$")
SHA256_RE = re.compile(r"^[0-9a-f]{64}$")
DIGEST_RE = re.compile(r"^sha256:[0-9a-f]{64}$")
# An exact version: starts with a digit, no range operators, no wildcards.
VERSION_RE = re.compile(r"^[0-9][0-9A-Za-z.+!_-]*$")
# ROCm targets this project knows how to build for; a typo like gfx1115 must not reach cmake,
# where an unknown or empty GPU_TARGETS silently falls back to gfx906.
KNOWN_GPU_TARGETS = frozenset(
    {
        "gfx906", "gfx908", "gfx90a", "gfx942", "gfx950",
        "gfx1030", "gfx1100", "gfx1101", "gfx1102", "gfx1103",
        "gfx1150", "gfx1151", "gfx1152", "gfx1200", "gfx1201",
    }
)
FLOATING_WORDS = {"latest", "main", "master", "head", "nightly", "stable", "develop", "dev"}


def _commit(value: str) -> str:
    if not isinstance(value, str) or not COMMIT_RE.match(value):
        hint = " (a branch, tag or 'latest' is not a pin; `toolbox bump` resolves one)"
        raise ValueError(f"must be a full 40-hex commit, got {value!r}{hint}")
    return value


def _version(value: Any) -> str:
    if isinstance(value, (int, float)):
        raise ValueError(f"write the version as a quoted string, got {value!r}")
    if not isinstance(value, str) or value.lower() in FLOATING_WORDS or not VERSION_RE.match(value):
        raise ValueError(f"must be an exact version like 1.2.3, got {value!r} (no ranges, no 'latest')")
    return value


def _sha256(value: str | None) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not SHA256_RE.match(value):
        raise ValueError(f"must be 64 lowercase hex characters (a sha256), got {value!r}")
    return value


def _url(value: str) -> str:
    if not isinstance(value, str) or not re.match(r"^(https?|file)://\S+$", value):
        raise ValueError(f"must be an http(s) or file URL, got {value!r}")
    return value


class Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Base(Model):
    image: str
    digest: Optional[str] = None
    family: Literal["fedora", "debian"]
    python: str = "python3"
    unverified: bool = False

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
    url: str
    sha256: Optional[str] = None
    unverified: bool = False
    _u = field_validator("url")(classmethod(lambda cls, v: _url(v)))
    _s = field_validator("sha256")(classmethod(lambda cls, v: _sha256(v)))

    @model_validator(mode="after")
    def _hash_or_unverified(self) -> "Tarball":
        if self.sha256 is None and not self.unverified:
            raise ValueError("sha256 is required (or mark the pin `unverified: true`)")
        return self


class TheRockSource(Model):
    repo: str
    commit: str
    components: list[str]
    unverified: bool = False
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
    source: Literal["tarball", "source"]
    version: str
    prefix: str = "/opt/rocm"
    tarball: Optional[Tarball] = None
    therock: Optional[TheRockSource] = None
    _v = field_validator("version")(classmethod(lambda cls, v: _version(v)))

    @model_validator(mode="after")
    def _source_block(self) -> "Rocm":
        if self.source == "tarball" and self.tarball is None:
            raise ValueError("source: tarball needs a `tarball:` block (url, sha256)")
        if self.source == "source" and self.therock is None:
            raise ValueError("source: source needs a `therock:` block (repo, commit, components)")
        return self


def _targets(v: list[str]) -> list[str]:
    for t in v:
        if t not in KNOWN_GPU_TARGETS:
            raise ValueError(f"unknown GPU target {t!r}; known: {', '.join(sorted(KNOWN_GPU_TARGETS))}")
    return sorted(set(v))


class Rccl(Model):
    repo: str
    # None only while unverified: the build then cannot fetch RCCL at all.
    commit: Optional[str] = None
    subdir: str = "projects/rccl"
    patches: Optional[str] = None
    # None: the stack's gpu_targets, so another target is one field for the whole stack.
    gpu_targets: Optional[list[str]] = None
    enable_smi: bool = False
    build_rccl_tests: bool = False
    unverified: bool = False
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
    index_url: Optional[str] = None
    torch: str
    torchvision: Optional[str] = None
    torchaudio: Optional[str] = None
    unverified: bool = False
    _v = field_validator("torch", "torchvision", "torchaudio")(
        classmethod(lambda cls, v: None if v is None else _version(v))
    )
    _u = field_validator("index_url")(classmethod(lambda cls, v: None if v is None else _url(v)))


class Bitsandbytes(Model):
    repo: str = "https://github.com/bitsandbytes-foundation/bitsandbytes"
    commit: str
    version: str
    unverified: bool = False
    _u = field_validator("repo")(classmethod(lambda cls, v: _url(v)))
    _c = field_validator("commit")(classmethod(lambda cls, v: _commit(v)))
    _v = field_validator("version")(classmethod(lambda cls, v: _version(v)))


class PatchRef(Model):
    """A patch applied to a source tree: a file in the repo, or an upstream diff by URL + sha256."""

    file: Optional[str] = None
    url: Optional[str] = None
    sha256: Optional[str] = None
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
    source: Literal["git", "pypi"]
    version: str
    zoo_version: str
    repo: str = "https://github.com/unslothai/unsloth"
    commit: Optional[str] = None
    zoo_repo: str = "https://github.com/unslothai/unsloth-zoo"
    zoo_commit: Optional[str] = None
    extras: list[str] = []
    patches: list[PatchRef] = []
    unverified: bool = False
    _v = field_validator("version", "zoo_version")(classmethod(lambda cls, v: _version(v)))
    _c = field_validator("commit", "zoo_commit")(classmethod(lambda cls, v: None if v is None else _commit(v)))

    @model_validator(mode="after")
    def _git_needs_commits(self) -> "Unsloth":
        if self.source == "git" and (self.commit is None or self.zoo_commit is None):
            raise ValueError("source: git needs `commit` and `zoo_commit` (40-hex)")
        return self


class Hf(Model):
    transformers: str
    trl: str
    peft: str
    accelerate: str
    datasets: str
    _v = field_validator("transformers", "trl", "peft", "accelerate", "datasets")(
        classmethod(lambda cls, v: _version(v))
    )


class Image(Model):
    title: str = "toolbox"
    description: str = ""
    source: str = "https://github.com/toolbox/toolbox"
    licenses: str = "Apache-2.0"
    vendor: str = "toolbox"


class StackModel(Model):
    name: str
    description: str = ""
    platform: Literal["rocm", "cuda", "cpu"]
    base: Base
    gpu_targets: list[str] = []
    rocm: Optional[Rocm] = None
    rccl: Optional[Rccl] = None
    torch: Torch
    bitsandbytes: Optional[Bitsandbytes] = None
    unsloth: Optional[Unsloth] = None
    hf: Hf
    image: Image = Image()
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
                raise ValueError("platform rocm needs a `rocm:` block")
            if not self.gpu_targets:
                raise ValueError("platform rocm needs gpu_targets (e.g. [gfx1151])")
            if self.rccl is not None and self.rccl.gpu_targets is not None:
                extra = sorted(set(self.rccl.gpu_targets) - set(self.gpu_targets))
                if extra:
                    raise ValueError(f"rccl.gpu_targets names {', '.join(extra)}, which gpu_targets does not "
                                     "(drop rccl.gpu_targets to follow gpu_targets)")
        else:
            for key in ("rocm", "rccl"):
                if getattr(self, key) is not None:
                    raise ValueError(f"`{key}:` only belongs to platform rocm")
            if self.gpu_targets:
                raise ValueError("gpu_targets only belongs to platform rocm")
        return self


@dataclass
class _Origin:
    """Where each field path of the merged raw stack came from (file, line)."""

    lines: dict[tuple, tuple[str, int]] = field(default_factory=dict)

    def find(self, path: tuple) -> tuple[str, int | None]:
        for n in range(len(path), -1, -1):
            if path[:n] in self.lines:
                return self.lines[path[:n]]
        return ("<stack>", None)


class _Loader(yaml.SafeLoader):
    pass


def _construct(node: yaml.Node, src: str, path: tuple, origin: _Origin) -> Any:
    origin.lines[path] = (src, node.start_mark.line + 1)
    if isinstance(node, yaml.MappingNode):
        out: dict = {}
        for k_node, v_node in node.value:
            key = k_node.value
            if key in out:
                raise UserError(f"{src}:{k_node.start_mark.line + 1}: {'.'.join(map(str, path + (key,)))}: duplicate key")
            origin.lines[path + (key,)] = (src, k_node.start_mark.line + 1)
            out[key] = _construct(v_node, src, path + (key,), origin)
            origin.lines[path + (key,)] = (src, k_node.start_mark.line + 1)
        return out
    if isinstance(node, yaml.SequenceNode):
        return [_construct(v, src, path + (i,), origin) for i, v in enumerate(node.value)]
    loader = _Loader("")
    return loader.construct_object(node, deep=True)


def _read_yaml(path: Path, origin: _Origin) -> dict:
    src = str(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise UserError(f"{src}: cannot read stack file: {exc.strerror}") from None
    try:
        node = yaml.compose(text, Loader=_Loader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f":{mark.line + 1}" if mark else ""
        raise UserError(f"{src}{where}: malformed YAML: {getattr(exc, 'problem', exc)}") from None
    if node is None or not isinstance(node, yaml.MappingNode):
        raise UserError(f"{src}:1: a stack file must be a YAML mapping")
    return _construct(node, src, (), origin)


def _merge(base: dict, over: dict) -> dict:
    out = copy.deepcopy(base)
    for k, v in over.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = _merge(out[k], v)
        else:
            out[k] = copy.deepcopy(v)
    return out


def stack_names() -> list[str]:
    return sorted(p.stem for p in STACKS_DIR.glob("*.yaml"))


def resolve_ref(ref: str | None, relative_to: Path | None = None) -> Path:
    ref = ref or DEFAULT_STACK
    if re.match(r"^[a-z0-9][a-z0-9._-]*$", ref) and (STACKS_DIR / f"{ref}.yaml").is_file():
        return STACKS_DIR / f"{ref}.yaml"
    p = Path(ref)
    if relative_to is not None and not p.is_absolute():
        p = relative_to / p
    if p.is_file():
        return p
    raise UserError(f"no stack {ref!r}: neither a shipped stack ({', '.join(stack_names())}) nor a file")


def _load_raw(path: Path, origin: _Origin, seen: tuple[Path, ...] = ()) -> dict:
    path = path.resolve()
    if path in seen:
        raise UserError(f"{path}: extends: cycle ({' -> '.join(str(s) for s in seen + (path,))})")
    raw = _read_yaml(path, origin)
    parent = raw.pop("extends", None)
    if parent is None:
        return raw
    if not isinstance(parent, str):
        _, line = origin.find(("extends",))
        raise UserError(f"{path}:{line}: extends: must be a stack name or a path")
    base_origin = _Origin()
    base = _load_raw(resolve_ref(parent, relative_to=path.parent), base_origin, seen + (path,))
    # The child's lines win where it sets a field; the rest point into the parent.
    merged_lines = dict(base_origin.lines)
    merged_lines.update({k: v for k, v in origin.lines.items() if k != ("extends",)})
    origin.lines = merged_lines
    return _merge(base, raw)


def _apply_override(raw: dict, text: str, origin: _Origin) -> None:
    src = f"--set {text}"
    key, sep, value = text.partition("=")
    if not sep or not re.match(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$", key):
        raise UserError(f"{src}: expected key.path=value")
    try:
        parsed = yaml.safe_load(value) if value != "" else ""
    except yaml.YAMLError:
        parsed = value
    # Versions stay strings: `--set hf.trl=1.10` must not become the float 1.1.
    if isinstance(parsed, (int, float)) and not isinstance(parsed, bool):
        parsed = value
    parts = key.split(".")
    node = raw
    for i, part in enumerate(parts[:-1]):
        nxt = node.get(part)
        if nxt is None:
            nxt = node[part] = {}
        if not isinstance(nxt, dict):
            raise UserError(f"{src}: {'.'.join(parts[: i + 1])} is not a mapping")
        node = nxt
    node[parts[-1]] = parsed
    for n in range(1, len(parts) + 1):
        origin.lines[tuple(parts[:n])] = (src, None)


def _format_errors(exc: ValidationError, origin: _Origin) -> str:
    msgs = []
    for err in exc.errors():
        loc = tuple(p for p in err["loc"] if not (isinstance(p, str) and p.startswith("function-")))
        src, line = origin.find(loc)
        where = f"{src}:{line}" if line else src
        path = ".".join(str(p) for p in loc) or "<top>"
        msg = err["msg"].removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            msg = "unknown key (check the spelling)"
        msgs.append(f"{where}: {path}: {msg}")
    return "\n".join(msgs)


class Stack:
    """A validated stack and what is derived from it (pins, lock, digest)."""

    def __init__(self, model: StackModel, source: Path, origin: _Origin):
        self.model = model
        self.source = source
        self._origin = origin
        self.rccl_patch_dir = self._check_patches()
        self.unsloth_patches = self.unsloth_patch_files()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.model, name)

    @property
    def rccl_targets(self) -> list[str]:
        r = self.model.rccl
        return [] if r is None else (r.gpu_targets if r.gpu_targets is not None else self.model.gpu_targets)

    @property
    def base_image(self) -> str:
        return self.model.base.ref

    def _check_patches(self) -> Path | None:
        """Resolve the RCCL series dir and every patch it names, so a missing file fails here."""
        rccl = self.model.rccl
        if rccl is None or rccl.patches is None:
            return None
        src, line = self._origin.find(("rccl", "patches"))
        where = f"{src}:{line}" if line else src
        d = Path(rccl.patches)
        candidates = [d] if d.is_absolute() else [self.source.parent / d, PROJECT_ROOT / d]
        found = next((c for c in candidates if c.is_dir()), None)
        if found is None:
            raise UserError(f"{where}: rccl.patches: no patch series directory {rccl.patches!r}")
        for name in series_files(found):
            if not (found / name).is_file():
                raise UserError(f"{where}: rccl.patches: missing patch file {name!r} named in {found / 'series'}")
        return found.resolve()

    def unsloth_patch_files(self) -> list[Path]:
        """Local patch files for Unsloth, each checked to exist (URL patches are fetched in the build)."""
        out = []
        for i, p in enumerate(self.model.unsloth.patches if self.model.unsloth else []):
            if p.file is None:
                continue
            src, line = self._origin.find(("unsloth", "patches", i, "file"))
            f = Path(p.file)
            cands = [f] if f.is_absolute() else [self.source.parent / f, PROJECT_ROOT / f]
            hit = next((c for c in cands if c.is_file()), None)
            if hit is None:
                raise UserError(f"{src}:{line}: unsloth.patches.{i}.file: missing patch file {p.file!r}")
            out.append(hit.resolve())
        return out

    def patch_series_digest(self) -> str | None:
        if self.rccl_patch_dir is None:
            return None
        h = hashlib.sha256()
        for name in series_files(self.rccl_patch_dir):
            h.update(name.encode() + b"\0" + (self.rccl_patch_dir / name).read_bytes() + b"\0")
        return h.hexdigest()

    def lock(self) -> dict[str, str]:
        from toolbox import components

        pins: dict[str, str] = {}
        for comp in components.active(self):
            pins.update(comp.pins(self))
        return dict(sorted(pins.items()))

    def lock_digest(self) -> str:
        blob = json.dumps({"stack": self.name, "pins": self.lock()}, sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:12]

    def unverified_pins(self) -> list[str]:
        out = []

        def walk(obj: Any, path: str) -> None:
            if isinstance(obj, BaseModel):
                if getattr(obj, "unverified", False):
                    out.append(path)
                for name in type(obj).model_fields:
                    walk(getattr(obj, name), f"{path}.{name}" if path else name)

        walk(self.model, "")
        return sorted(out)


def series_files(d: Path) -> list[str]:
    """Patch names in order: the `series` file (quilt style) where there is one, else *.patch sorted."""
    series = d / "series"
    if series.is_file():
        names = []
        for raw in series.read_text(encoding="utf-8").splitlines():
            line = raw.split("#", 1)[0].strip()
            if line:
                names.append(line.split()[0])
        return names
    return sorted(p.name for p in d.glob("*.patch"))


def load_stack(ref: str | None = None, overrides: Sequence[str] = ()) -> Stack:
    path = resolve_ref(ref)
    origin = _Origin()
    raw = _load_raw(path, origin)
    for text in overrides:
        _apply_override(raw, text, origin)
    try:
        model = StackModel.model_validate(raw)
    except ValidationError as exc:
        raise UserError(_format_errors(exc, origin)) from None
    return Stack(model, path.resolve(), origin)
