"""PyTorch (+ torchvision, torchaudio) at exact versions from the stack's index."""

import re
import shlex

from typing import Optional

from pydantic import Field, field_validator, model_validator

from toolbox.components import Component, LockPart, Model, python_version
from toolbox.errors import UserError
from toolbox.components.values import (
    GFX_RE, FieldError, check_url as _url, check_version as _version, check_wheel_ref, covers,
)


def device_extra(stack) -> str:
    """`[device-gfx1151]` for a multi-arch index (TheRock RELEASES.md, multi-arch PyTorch): the
    extra pulls amd-torch-device-<target> and rocm-sdk-device-<target>, the GPU code; without it
    pip installs host code only."""
    if not stack.model.torch.multi_arch:
        return ""
    return "[" + ",".join(f"device-{t}" for t in stack.model.gpu_targets) + "]"


def requirements(stack) -> list[str]:
    t = stack.model.torch
    extra = device_extra(stack)
    reqs = [f"torch{extra}=={t.torch}"]
    if t.torchvision:
        reqs.append(f"torchvision{extra}=={t.torchvision}")
    if t.torchaudio:
        reqs.append(f"torchaudio=={t.torchaudio}")
    return reqs


def install_requirements(stack) -> list[str]:
    """What pip installs: requirements() where a wheel is pinned by URL and sha256 (first use),
    `name[extra] @ URL#sha256=...`, whose hash pip checks; then each pinned wheel coupled to them
    (device wheels, triton, rocm-sdk-*, the rocm sdist, rocm-bootstrap), `name @ URL#sha256=...`:
    a direct URL is the only candidate pip has for that name. setuptools (the rocm sdist's build
    backend) is not among them: closed_set() installs it first."""
    out = []
    wheels = {n: hashed(ref) for n, ref in stack.model.torch.wheels.items()}
    for req in requirements(stack):
        name = req.split("[", 1)[0].split("==", 1)[0]
        ref = wheels.get(name)
        out.append(f"{req.split('==', 1)[0]} @ {ref}" if ref else req)
    own = ("torch", "torchvision", "torchaudio", "setuptools")
    return out + [f"{name} @ {ref}" for name, ref in sorted(wheels.items()) if name not in own]


def hashed(ref: str) -> str:
    """A wheel ref as the image installs it: a URL whose sha256 is left to first use (`toolbox
    build` fills it in) renders as #sha256=UNVERIFIED, which no file matches, as the tarball's does."""
    return ref if "#sha256=" in ref else f"{ref}#sha256=UNVERIFIED"


def closed_set(stack) -> dict | None:
    """The image's torch step where the stack pins the whole ROCm set by URL (the `rocm` sdist
    included), else None (torch from its index). Each list is one command's arguments:
    `setuptools`: installed first, so the `rocm` sdist builds without an index; `install`: the set,
    with --no-index --no-deps (no index can supply any part of it, not even PyPI's placeholders of
    rocm, rocm-sdk-core, amd-torch-device-gfx115x, rocm-bootstrap); `check`: requires.py --closed,
    which fails unless every requirement a wheel of the set has on a ROCm name is met by another;
    `env`: for the sdist's build, which would ask offload-arch (no GPU in a build) for the target."""
    wheels = stack.model.torch.wheels
    if "torch" not in wheels or "rocm" not in wheels:
        return None
    head = ["--no-index", "--no-deps"]
    return {"setuptools": [*head, f"setuptools @ {hashed(wheels['setuptools'])}"] if "setuptools" in wheels else [],
            "install": [*head, "--no-build-isolation", *install_requirements(stack)],
            "check": ["--closed", *requirements(stack)],
            "env": {"ROCM_SDK_TARGET_FAMILY": stack.model.gpu_targets[0], "ROCM_BOOTSTRAP_DISABLE_DETECTION": "1"}}


def _checks(model) -> None:
    """On ROCm: the tarball and the index are for the stack's targets, and torch is one exact
    build of the ROCm line (_one_rocm_line)."""
    if model.platform != "rocm":
        return
    stale = [(name, url) for name, url in (
        ("rocm.tarball.url", model.rocm.tarball.url if model.rocm.source == "tarball" else None),
        ("torch.index_url", model.torch.index_url)) if url and not covers(url, model.gpu_targets)]
    if stale:
        names = " and ".join(n for n, _ in stale)
        built = ", ".join(sorted({t for _, u in stale for t in GFX_RE.findall(u)}))
        raise FieldError(("gpu_targets",), f"{names} {'are' if len(stale) > 1 else 'is'} for {built}, "
                         f"not gpu_targets {', '.join(model.gpu_targets)}: set {names} for "
                         f"{', '.join(model.gpu_targets)} too (a tarball URL without its sha256 is "
                         "pinned on first use)")
    _one_rocm_line(model)


def _one_rocm_line(model) -> None:
    """From ROCm 10 on, AMD's indexes hold 7.x and 10.x builds side by side, and pip/uv compare
    local versions as text: +rocm10.0.0 sorts below +rocm7.15.0a... (TheRock
    docs/packaging/versioning.md, #7183). So a torch pin that is not one exact build of this
    ROCm line (+rocm<major>.<minor>.<patch>) could install a 7.x wheel into a 10.x image: refused."""
    major = re.match(r"(\d+)\.(\d+)", model.rocm.version)
    if not model.torch.index_url or major is None or int(major[1]) < 10:
        return
    line = f"{major[1]}.{major[2]}"
    for key in ("torch", "torchvision", "torchaudio"):
        v = getattr(model.torch, key)
        if v is None:
            continue
        local = v.partition("+")[2]
        m = re.fullmatch(r"rocm(\d+)\.(\d+)\.\d+", local)
        if m and f"{m[1]}.{m[2]}" == line:
            continue
        why = "has no local version" if not local else f"names +{local}"
        raise FieldError(("torch", key), f"{v} {why}: on ROCm {model.rocm.version} pin one exact build of "
                         f"its line, +rocm{line}.<patch> (a 7.x wheel sorts above a 10.x one as text, so "
                         "anything looser can install the wrong ROCm line)")


def _first_use_index(stack) -> bool:
    """AMD's wheel index serves torch: only the user's network reaches it, so its pins are not in
    the checked-in Python lock (first-use there) and its wheels are pinned on first use instead."""
    return stack.model.platform == "rocm" and bool(stack.model.torch.index_url)


def _lock(stack) -> LockPart:
    t = stack.model.torch
    first_use = {}
    if _first_use_index(stack):
        for r in requirements(stack):
            how = ("installed by the stack's torch.wheels URL, whose sha256 pip checks"
                   if r.split("[", 1)[0].split("=", 1)[0] in t.wheels else "installed without a hash check")
            first_use[r] = f"from {t.index_url}: not reachable when locking; {how}"
    return LockPart(requirements=() if first_use else tuple(requirements(stack)), first_use=first_use,
                    index_url=t.index_url, local_wheels="+" in t.torch, first="torch",
                    hint=f"torch {t.torch} is looked up on {t.index_url}" if t.index_url else "")


def _first_use(stack, pin):
    """AMD-index wheels of torch/torchvision/torchaudio, and the URL-pinned ROCm set's sha256s."""
    torch, out = stack.model.torch, []
    if _first_use_index(stack):
        for name in ("torch", "torchvision", "torchaudio"):
            version = getattr(torch, name)
            if version is not None and name not in torch.wheels:
                out.append((("torch", "wheels", name), pin.wheel(torch.index_url, name, version, python_version(stack))))
    # The ROCm set pinned by URL whose sha256s no record gives (ROCm 10.1): hashed on first use.
    for name, ref in sorted(torch.wheels.items()):
        if "#sha256=" not in ref:
            out.append((("torch", "wheels", name), f"{ref}#sha256={pin.file(ref, f'torch.wheels.{name}')}"))
    if torch.unverified and any(path[:2] == ("torch", "wheels") for path, _ in out):
        out.append((("torch", "unverified"), False))
    return out


def _bump(stack, to, tools):
    """`toolbox bump torch`: torch, torchvision and torchaudio from the stack's index for its ROCm
    (toolbox.stack.releases.resolve_torch), with the wheels coupled to them."""
    index = tools.index_url or stack.model.torch.index_url
    if stack.model.rocm is None or not index:
        raise UserError(f"{tools.path}: torch: bump torch needs a ROCm stack with torch.index_url (or --index-url)")
    return {**tools.wheels(stack, index, to), "torch.unverified": False}


def _pins(stack):
    t = stack.model.torch
    pins = {"torch.version": t.torch}
    if t.torchvision:
        pins["torchvision.version"] = t.torchvision
    if t.torchaudio:
        pins["torchaudio.version"] = t.torchaudio
    if t.index_url:
        pins["torch.index_url"] = t.index_url
    if t.multi_arch:
        pins["torch.device_extra"] = device_extra(stack)
    for name, ref in sorted(t.wheels.items()):
        pins[f"{name}.wheel_sha256"] = ref.rsplit("#sha256=", 1)[1] if "#sha256=" in ref else "unverified"
    return pins


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


COMPONENT = Component("torch", place=30,
                      block=Torch, field=Field(description='PyTorch'),
                      applies=lambda s: True, pins=_pins, runtime="runtime/torch.j2",
                      lock=_lock, first_use_pins=_first_use, bumps={"torch": _bump}, checks=_checks,
                      # reqs: what later pip steps repeat to keep torch as it is
                      exports=lambda s: {"version": s.model.torch.torch, "index_url": s.model.torch.index_url,
                                         "reqs": [shlex.quote(r) for r in requirements(s)]},
                      # Quoted for the RUN shell: a [device-...] extra is a glob pattern there.
                      # torch_reqs: what later pip steps repeat to keep torch as it is (versions: already
                      # satisfied); torch_install_reqs: what the torch step installs (pinned wheel URLs).
                      variables=lambda s, pin_set: {"torch_reqs": [shlex.quote(r) for r in requirements(s)],
                                                 "torch_install_reqs": [shlex.quote(r) for r in install_requirements(s)],
                                                 "torch_closed": _quoted(closed_set(s))})


def _quoted(steps: dict | None) -> dict | None:
    if steps is None:
        return None
    return {k: ([f"{n}={shlex.quote(v)}" for n, v in a.items()] if k == "env" else [shlex.quote(x) for x in a])
            for k, a in steps.items()}
