"""The OS layer: base image, toolbx/distrobox packages, the /opt/venv Python environment."""

import re
from typing import Literal, Optional

from pydantic import Field, field_validator

from toolbox.components import Component, ContextFile, Model
from toolbox.components.values import DIGEST_RE, FLOATING_WORDS, pinned_is_verified as _pinned_is_verified
from toolbox.errors import UserError
from toolbox.paths import PROJECT_ROOT

SCRIPTS = PROJECT_ROOT / "dockerfiles" / "scripts"

# What toolbx and distrobox expect inside an image (they add the user and sudo rule at create).
# The commands distrobox-init (1.4.2.1) checks before its first `enter` are here too (diff,
# pinentry, wget, bc, time, lsof): without them that enter apt/dnf-installs them, offline it fails.
TOOLBX_PACKAGES = {
    "fedora": ["bash", "bc", "diffutils", "findutils", "hostname", "iproute", "less", "lsof",
               "passwd", "pinentry", "procps-ng", "shadow-utils", "sudo", "tar", "time",
               "util-linux", "wget", "which"],
    "debian": ["bash", "bc", "diffutils", "findutils", "hostname", "iproute2", "less", "lsof",
               "passwd", "pinentry-curses", "procps", "sudo", "tar", "time", "util-linux", "wget"],
}
# What the steps and the runtime need besides toolbx's list. bubblewrap: the sandbox that GRPO's python_tests
# reward runs model-written code in (entrypoints/toolbox_train/sandbox; the same package name on both).
RUNTIME_PACKAGES = {
    "fedora": ["bubblewrap", "ca-certificates", "curl", "gzip", "libatomic", "numactl-libs", "xz"],
    "debian": ["bubblewrap", "ca-certificates", "curl", "gzip", "python3-venv", "xz-utils"],
}
# Multi-node RDMA (RoCE/InfiniBand): libibverbs with the user-space NIC providers, which RCCL/NCCL
# load at run time (without one for the NIC they fall back to TCP sockets). Fedora's libibverbs
# carries every provider (mlx5, irdma, bnxt_re, ...; rdma-core's redhat/rdma-core.spec);
# Debian's are in ibverbs-providers (bookworm 44.0: libmlx5, libirdma, libbnxt_re). The utils
# give ibv_devinfo to look at a node's devices and GID tables.
RDMA_PACKAGES = {
    "fedora": ["libibverbs", "libibverbs-utils", "librdmacm"],
    "debian": ["ibverbs-providers", "ibverbs-utils", "libibverbs1", "librdmacm1"],
}
# Compilers and sources: builder stages only, never the runtime stage.
DEVEL_PACKAGES = {
    "fedora": ["ccache", "cmake", "gcc-c++", "git-core", "make", "ninja-build", "patch", "python3-devel"],
    "debian": ["build-essential", "ccache", "cmake", "git", "ninja-build", "patch", "python3-dev"],
}


def os_packages(stack, kind: str) -> list[str]:
    fam = stack.model.base.family
    table = {"toolbx": TOOLBX_PACKAGES, "runtime": RUNTIME_PACKAGES, "devel": DEVEL_PACKAGES}[kind]
    pkgs = list(table[fam])
    if kind == "runtime" and fam == "fedora":
        pkgs.append(stack.model.base.python)
    if kind == "runtime" and fam == "debian":
        pkgs.append("python3")
    if kind == "runtime" and stack.model.platform in ("rocm", "cuda"):
        pkgs += RDMA_PACKAGES[fam]  # GPU images train across nodes; the cpu image uses gloo over TCP
    return sorted(set(pkgs))


# The interpreter the image's /opt/venv is made with: Debian bookworm's python3 is 3.11.
DEBIAN_PYTHON = {"bookworm": "3.11", "bookworm-slim": "3.11", "trixie": "3.13", "trixie-slim": "3.13"}


def python_version(stack) -> str:
    """The Python of the image's venv ("3.12"): a Debian tag's python3, else base.python's."""
    base = stack.model.base
    if base.family == "debian":
        tag = base.image.rsplit(":", 1)[-1]
        if tag not in DEBIAN_PYTHON:
            raise UserError(f"{stack.origin.where(('base', 'image'))}: base.image: which Python does {base.image} "
                            f"carry? known Debian tags: {', '.join(DEBIAN_PYTHON)}")
        return DEBIAN_PYTHON[tag]
    m = re.fullmatch(r"python(3\.\d+)", base.python)
    if not m:
        raise UserError(f"toolbox lock: base.python {base.python!r} names no version (python3.X)")
    return m.group(1)


def _first_use(stack, pin):
    """An unpinned base image's digest, pulled once (the last first-use pin: the longest fetch)."""
    base = stack.model.base
    if base.digest is None and base.unverified:
        return [(("base", "digest"), pin.image(base.image)), (("base", "unverified"), False)]
    return []


def _bump(stack, to, tools):
    """`toolbox bump base [--to TAG]`: the image tag resolved to its manifest digest (registry v2 API)."""
    changes: dict[str, object] = {}
    image = stack.model.base.image
    if to and to != "latest":
        image = f"{image.rpartition(':')[0]}:{to}"
        changes["base.image"] = image
    changes.update({"base.digest": tools.digest(image), "base.unverified": False})
    return changes


def _pins(stack):
    pins = {"base.image": stack.model.base.image}
    if stack.model.base.digest:
        pins["base.digest"] = stack.model.base.digest
    return pins


def _variables(stack, pin_set):
    return {
        "packages": {k: os_packages(stack, k) for k in ("runtime", "toolbx", "devel")},
        "python": "python3" if stack.model.base.family == "debian" else stack.model.base.python,
    }


def _context(stack):
    out = [ContextFile(f"scripts/{f.name}", src=f) for f in sorted(SCRIPTS.iterdir()) if f.suffix == ".sh"]
    out.append(ContextFile("scripts/profile.sh", template="scripts/profile.sh.j2"))
    # Empty unless --wheelhouse fills it; every RUN bind-mounts it as pip's find-links.
    out.append(ContextFile("wheelhouse"))
    # Present in every context (empty unless the rccl component fills it): one layout for all stacks.
    out.append(ContextFile("rccl-patches"))
    return out


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


COMPONENT = Component("base", place=0,
                      block=Base, field=Field(description="the base image"),
                      applies=lambda s: True, pins=_pins, builder="stages/base.j2",
                      variables=_variables, context=_context, interpreter=python_version,
                      exports=lambda s: {"family": s.model.base.family,
                                         "packages": {k: os_packages(s, k) for k in ("runtime", "toolbx", "devel")}},
                      bumps={"base": _bump}, first_use_pins=_first_use, pin_place=1000)
