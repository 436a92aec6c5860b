"""Checks of single stack values (commits, versions, hashes, URLs, GPU targets, pinned wheels),
used by the components' blocks and the stack schema (toolbox.stack.model); each raises ValueError
(or FieldError) with the message the user sees next to the field's line."""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import unquote

from pydantic import model_validator

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


class FieldError(ValueError):
    """A model-level check about one field: errors are reported at that field's line, not the top."""

    def __init__(self, field: tuple, message: str):
        super().__init__(message)
        self.field = field


def check_commit(value: str) -> str:
    if not isinstance(value, str) or not COMMIT_RE.match(value):
        hint = " (a branch, tag or 'latest' is not a pin; `toolbox bump` resolves one)"
        raise ValueError(f"must be a full 40-hex commit, got {value!r}{hint}")
    return value


def check_version(value: Any) -> str:
    if isinstance(value, (int, float)):
        raise ValueError(f"write the version as a quoted string, got {value!r}")
    if not isinstance(value, str) or value.lower() in FLOATING_WORDS or not VERSION_RE.match(value):
        raise ValueError(f"must be an exact version like 1.2.3, got {value!r} (no ranges, no 'latest')")
    return value


def check_sha256(value: str | None) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not SHA256_RE.match(value):
        raise ValueError(f"must be 64 lowercase hex characters (a sha256), got {value!r}")
    return value


def check_url(value: str) -> str:
    if not isinstance(value, str) or not re.match(r"^(https?|file)://\S+$", value):
        raise ValueError(f"must be an http(s) or file URL, got {value!r}")
    return value


def pinned_is_verified(key: str):
    """A before-validator: a block whose hash `key` is set (in a stack file or by --set) counts as
    verified, whatever `unverified:` an extended stack said (issue 12: `--set ...sha256=` alone)."""

    def check(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get(key) is not None and data.get("unverified"):
            data = {**data, "unverified": False}
        return data

    return model_validator(mode="before")(classmethod(check))


GFX_RE = re.compile(r"gfx[0-9a-zA-Z]+")


def covers(url: str, targets: list[str]) -> bool:
    """Whether a URL that names GPU targets (gfx1151, or a family like gfx110X) names each of
    targets; a URL naming none (a mirror, PyTorch's index) is not judged."""
    names = GFX_RE.findall(url)
    return not names or all(any(t == n or (n[-1] in "xX" and t.startswith(n[:-1])) for n in names)
                            for t in targets)


def check_targets(v: list[str]) -> list[str]:
    for t in v:
        if t not in KNOWN_GPU_TARGETS:
            raise ValueError(f"unknown GPU target {t!r}; known: {', '.join(sorted(KNOWN_GPU_TARGETS))}")
    return sorted(set(v))



def coupled_names(targets=KNOWN_GPU_TARGETS) -> list[str]:
    """The wheels TheRock couples to its torch, torchvision and torchaudio by exact versions
    (torch's metadata and its [device-<target>] extras require them): `torch.wheels` may pin
    these too, so pip takes none of the ROCm set from an index. Also the family device wheel
    (amd-torch-device-gfx115x: the attention kernels, which torch[device-gfx1151] pulls beside the
    target's own), the `rocm` sdist (the rocm_sdk module torch initializes with), rocm-bootstrap
    (torch requires it, unversioned) and setuptools (the `rocm` sdist's build backend): PyPI holds
    placeholders named rocm, rocm-sdk-core, amd-torch-device-gfx115x and rocm-bootstrap."""
    per_target = ("amd-torch-device-{}", "amd-torchvision-device-{}", "rocm-sdk-device-{}")
    families = sorted({FAMILY[t] for t in targets if t in FAMILY})
    return ["triton", "rocm-sdk-core", "rocm-sdk-libraries", "rocm", *UNCOUPLED,
            *(p.format(t) for t in sorted(targets) for p in per_target), *(f"amd-torch-device-{f}" for f in families)]


# The family of a target where TheRock ships a family device wheel (its `rocm_whl_next_ownership.yaml`
# lists amd-torch-device-gfx110x and -gfx115x; a gfx1151 venv holds amd_torch_device_gfx115x beside
# amd_torch_device_gfx1151).
FAMILY = {**{f"gfx110{i}": "gfx110x" for i in range(4)}, **{f"gfx115{i}": "gfx115x" for i in range(4)}}
# Pinned with the set but not by the set's version: torch requires rocm-bootstrap without one, and
# setuptools builds the `rocm` sdist.
UNCOUPLED = ("rocm-bootstrap", "setuptools")


def _coupled_version(name: str, torch: str, torchvision: str | None) -> str | None:
    """The version the coupled wheel `name` has on torch's +rocm<X> line: exact for the device
    wheels (torch's, torchvision's) and rocm-sdk-* (<X>); triton's `+git<hash>.rocm<X>` carries a
    build hash no pin names, so '*.rocm<X>' (checked by the caller). None: torch has no +rocm line."""
    if name.startswith("amd-torchvision-device-"):
        return torchvision or "(none: torch.torchvision is unset)"
    local = torch.partition("+")[2]
    if not re.fullmatch(r"rocm\d[0-9A-Za-z.]*", local):
        return None
    if name.startswith("amd-torch-device-"):
        return torch
    if name.startswith("rocm-sdk-") or name == "rocm":
        return local[len("rocm"):]
    return f"*.{local}"  # triton


def check_wheel_ref(name: str, ref: str, pinned: str | None, torch: str | None = None,
                    torchvision: str | None = None) -> None:
    """`torch.wheels.<name>`: '<wheel URL>#sha256=<64 hex>' of a package the block pins, at its
    version; or 'https://...#sha256=<64 hex>' of one coupled to it (coupled_names()), on the same
    +rocm<X> line as torch. Without '#sha256=...', the file's sha256 is pinned on first use."""
    from packaging.utils import (InvalidSdistFilename, InvalidWheelFilename, canonicalize_name, parse_sdist_filename,
                                 parse_wheel_filename)

    coupled = pinned is None and name in coupled_names()
    if pinned is None and not coupled:
        raise FieldError(("wheels", name), "names no package this block pins (torch, torchvision, torchaudio) nor "
                         "one coupled to them (triton, rocm-sdk-core, rocm-sdk-libraries, amd-torch-device-<target>, "
                         "amd-torch-device-<family>, amd-torchvision-device-<target>, rocm-sdk-device-<target>, "
                         "the rocm sdist, rocm-bootstrap, setuptools)")
    scheme = r"https://" if coupled else r"(?:https?|file)://"
    sdist = coupled and name == "rocm"  # an sdist only: built where it installs
    # No #sha256=: pinned on first use (the first build hashes the file and records it in the
    # user's pins file, a later build refuses other bytes: toolbox.stack.pinning).
    m = re.fullmatch(scheme + r"\S+/([^/#\s]+" + (r"\.tar\.gz" if sdist else r"\.whl") + r")(?:#sha256=([0-9a-f]{64}))?",
                     str(ref))
    if not m:
        want = "https://<wheel URL>" if coupled else "<wheel URL>"
        want = "https://<sdist URL>.tar.gz" if sdist else want
        raise FieldError(("wheels", name), f"expected '{want}#sha256=<64 hex>' (or the URL alone: "
                         f"its sha256 pinned on first use), got {ref!r}")
    try:
        if sdist:
            dist, version = parse_sdist_filename(unquote(m.group(1)))
        else:
            dist, version = parse_wheel_filename(unquote(m.group(1)))[:2]
    except (InvalidWheelFilename, InvalidSdistFilename) as exc:
        raise FieldError(("wheels", name), f"not a {'sdist' if sdist else 'wheel'} file name: {exc}") from None
    if not coupled:
        if str(version) != pinned:
            raise FieldError(("wheels", name), f"the wheel is version {version}, but torch.{name} pins {pinned}")
        return
    if dist != canonicalize_name(name):
        raise FieldError(("wheels", name), f"the wheel is {dist}'s, not {name}'s")
    if name in UNCOUPLED:
        return
    want = _coupled_version(name, torch or "", torchvision)
    if want is None:
        raise FieldError(("wheels", name), f"pins a wheel of the ROCm set, but torch.torch {torch} has no +rocm<X> line")
    ok = (version.local or "").endswith(want[1:]) if want.startswith("*.") else str(version) == want
    if not ok:
        line = (torch or "").partition("+")[2]
        of = f"torch.torchvision's {torchvision}" if name.startswith("amd-torchvision-device-") else f"torch's +{line} line"
        raise FieldError(("wheels", name), f"the wheel is version {version}, not {want} of {of}")
