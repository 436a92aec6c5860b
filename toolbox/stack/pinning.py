"""First-use pinning: what cannot be pinned offline is pinned the first time it is fetched.

AMD publishes no checksum beside TheRock's tarballs, and a base image's digest needs a
registry. So, like a lock file: the first `toolbox build` of a stack whose ROCm tarball has no
sha256 downloads it once into the user's cache, records its sha256 in the user's pins file
(pins.lock.json in the state folder, never in the installed package), says so in one loud
line, and every later build uses that hash; bytes that differ later are an error naming both
hashes. The same for an unpinned base image's digest. `--frozen` refuses anything not pinned yet.

After a tarball download, its share/therock/therock_manifest.json (TheRock's
build_tools/generate_therock_manifest.py, schema TheRock-Manifest.v1: `submodules[]` of
path/url/commit) must name the same rocm-systems commit as the stack's `rccl.commit`, so RCCL is
built from the sources of the ROCm that torch was built against; an unset (unverified)
rccl.commit is pinned to it.

`first_use_pins(stack, ...)` asks each active component's `first_use_pins` hook (rocm: the
tarball; rccl: its commit from the tarball's manifest; torch: AMD-index wheels and URL-pinned
sha256s; base: the digest, last) with a `Pinner` (this module's fetches and the pins file) and
returns typed `PinUpdate`s (a field path and its value) that make the stack verified;
`toolbox.stack.load.load_stack` applies them (a build's `first_use`) before the stack is resolved.
Nothing here names a component.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import urllib.error
import urllib.request
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable

from toolbox import components
from toolbox.errors import ToolError, UserError
from toolbox.files import atomic_write
from toolbox.paths import cache_dir, state_dir
from toolbox.stack import statefiles, wheel_index

PINS_FILE = "pins.lock.json"  # the name users have; the word for it is "pins file"
MANIFEST = "share/therock/therock_manifest.json"
CHUNK = 1 << 20


class PinsFile:
    """The user's pins file, of first-use pins: {"files": {url: {...}}, "images": {ref: {...}},
    "wheels": {key: {...}}}, with a format number and a checksum (toolbox.stack.statefiles: a
    damaged one is refused, naming it and how to make it again)."""

    def __init__(self, path: Path | None = None):
        self.path = path or state_dir() / PINS_FILE
        self.data: dict = {"files": {}, "images": {}, "wheels": {}}
        if self.path.exists() or self.path.is_symlink():
            self.data.update(statefiles.load_pins(self.path))

    def file(self, url: str) -> dict | None:
        return self.data["files"].get(url)

    def image(self, ref: str) -> dict | None:
        return self.data["images"].get(ref)

    def record(self, table: str, key: str, said: str, **entry) -> None:
        """A first-use pin: `entry` under `key` in `table` (files, images, wheels), stamped and saved, and
        `said` printed loudly (the user sees every pin taken on first use)."""
        self.data[table][key] = {**entry, "locked": _now()}
        self.save()
        _loud(said)

    def save(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(self.path, statefiles.dump_pins(self.data))


def _now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _loud(msg: str) -> None:
    print(f"toolbox: PINNED ON FIRST USE: {msg}", file=sys.stderr, flush=True)


def cached_path(url: str) -> Path:
    key = hashlib.sha256(url.encode()).hexdigest()[:16]
    return cache_dir() / "downloads" / key / url.rstrip("/").rsplit("/", 1)[-1]


def download(url: str, dest: Path, *, ca_bundle: Path | None = None) -> str:
    """Stream url into dest (atomically); returns its sha256. Network trouble is one clear error."""
    import ssl

    dest.parent.mkdir(parents=True, exist_ok=True)
    ctx = ssl.create_default_context(cafile=str(ca_bundle)) if ca_bundle else None
    h = hashlib.sha256()
    fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=".part-")
    try:
        with os.fdopen(fd, "wb") as out:
            try:
                with urllib.request.urlopen(url, timeout=60, context=ctx) as resp:
                    while chunk := resp.read(CHUNK):
                        h.update(chunk)
                        out.write(chunk)
            except urllib.error.HTTPError as exc:
                raise ToolError(f"network: cannot download {url} to pin it on first use: "
                                f"HTTP {exc.code} {exc.reason}") from None
            except (urllib.error.URLError, OSError) as exc:
                reason = getattr(exc, "reason", exc)
                raise ToolError(f"network: cannot download {url} to pin it on first use: {reason} "
                                "(this host cannot reach it; with a TLS proxy pass --ca-bundle FILE; "
                                "or pin it yourself: --set rocm.tarball.sha256=<64 hex>)") from None
        os.replace(tmp, dest)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        try:
            dest.parent.rmdir()  # a failed first download leaves no empty cache folder behind
        except OSError:
            pass
        raise
    return h.hexdigest()


def manifest_commit(tarball: Path, repo: str = "rocm-systems") -> str | None:
    """The commit that the tarball's TheRock manifest records for `repo` (None: no such entry)."""
    try:
        with tarfile.open(tarball, "r:*") as tf:
            for member in tf:
                if member.isfile() and member.name.lstrip("./").endswith(MANIFEST):
                    f = tf.extractfile(member)
                    doc = json.loads(f.read().decode("utf-8")) if f else {}
                    break
            else:
                raise UserError(f"{tarball}: no {MANIFEST} inside; not a TheRock dist tarball")
    except (tarfile.TarError, OSError, ValueError) as exc:
        raise UserError(f"{tarball}: cannot read {MANIFEST}: {exc}") from None
    for sub in doc.get("submodules") or []:
        names = {str(sub.get("path", "")).rstrip("/").rsplit("/", 1)[-1],
                 str(sub.get("url", "")).rstrip("/").removesuffix(".git").rsplit("/", 1)[-1]}
        if repo in names and sub.get("commit"):
            return str(sub["commit"])
    return None


def _check_manifest(tarball: Path, url: str, rccl_commit: str | None) -> str | None:
    commit = manifest_commit(tarball)
    if rccl_commit and commit and commit != rccl_commit:
        raise UserError(f"rocm tarball {url}: its {MANIFEST} names rocm-systems commit {commit}, "
                        f"but the stack's rccl.commit is {rccl_commit}; RCCL must be built from the "
                        "ROCm release torch was built against: set rccl.commit or pick the matching tarball")
    return commit


def pin_tarball(url: str, *, rccl_commit: str | None, pins_file: PinsFile, frozen: bool,
                ca_bundle: Path | None = None) -> str:
    """The sha256 of url: from the pins file (its cached copy re-checked when present), else fetched now."""
    entry = pins_file.file(url)
    if entry is None and frozen:
        raise UserError(f"--frozen: rocm.tarball {url} has no sha256 and is not in the pins file "
                        f"{pins_file.path}; build once without --frozen, or --set rocm.tarball.sha256=<64 hex>")
    if entry is not None and rccl_commit and entry.get("rocm_systems_commit") not in (None, rccl_commit):
        raise UserError(f"rocm tarball {url}: its {MANIFEST} names rocm-systems commit "
                        f"{entry['rocm_systems_commit']} (pins file {pins_file.path}), but the stack's "
                        f"rccl.commit is {rccl_commit}; set rccl.commit or pick the matching tarball")
    dest = cached_path(url)
    if entry is not None and (dest.is_file() or frozen):
        return entry["sha256"]  # --frozen reaches no network: the image's build checks the bytes
    got = download(url, dest, ca_bundle=ca_bundle)
    if entry is not None:
        if got != entry["sha256"]:
            dest.unlink(missing_ok=True)
            raise UserError(f"rocm tarball {url} changed: pinned sha256 {entry['sha256']} "
                            f"(on {entry.get('locked', '?')}, {pins_file.path}), downloaded now {got}; "
                            f"if the new bytes are intended, delete {pins_file.path} and build again "
                            "(every first-use pin is taken again)")
        return got
    try:
        commit = _check_manifest(dest, url, rccl_commit)
    except UserError:
        dest.unlink(missing_ok=True)
        raise
    pins_file.record("files", url, f"{url} sha256 {got} (AMD publishes no checksum; recorded in {pins_file.path}, "
                     "later builds must see the same bytes)", sha256=got, rocm_systems_commit=commit)
    return got


def pin_file(url: str, field: str, *, pins_file: PinsFile, frozen: bool, ca_bundle: Path | None = None) -> str:
    """The sha256 of a file the stack names by URL alone (`field`: a torch.wheels entry): from the
    pins file, else downloaded once into the cache, hashed and recorded; pip checks it in the image."""
    entry = pins_file.file(url)
    if entry is not None:
        return entry["sha256"]
    if frozen:
        raise UserError(f"--frozen: {field} {url} has no sha256 and is not in the pins file {pins_file.path}; "
                        f"build once without --frozen, or --set {field}='{url}#sha256=<64 hex>'")
    got = download(url, cached_path(url), ca_bundle=ca_bundle)
    pins_file.record("files", url, f"{url} sha256 {got} ({field}: no public record gives it; recorded in "
                     f"{pins_file.path}, later builds install exactly these bytes: pip checks the hash)", sha256=got)
    return got


def _fetch_text(url: str, ca_bundle: Path | None) -> tuple[str, str]:
    """(the page, the URL it came from after redirects: ROCm 10's stable whl-next/ sends each
    project page on to pytorch/whl-next/ or core/whl-next/, and relative links resolve there)."""
    import ssl

    ctx = ssl.create_default_context(cafile=str(ca_bundle)) if ca_bundle else None
    try:
        with urllib.request.urlopen(url, timeout=60, context=ctx) as resp:
            return resp.read().decode("utf-8", "replace"), resp.geturl()
    except urllib.error.HTTPError as exc:
        raise ToolError(f"network: cannot read {url} to pin its wheel on first use: HTTP {exc.code} {exc.reason}") from None
    except (urllib.error.URLError, OSError) as exc:
        raise ToolError(f"network: cannot read {url} to pin its wheel on first use: {getattr(exc, 'reason', exc)} "
                        "(with a TLS proxy pass --ca-bundle FILE; or pin it yourself: "
                        "--set torch.wheels.NAME='<wheel URL>#sha256=<64 hex>')") from None


def pin_wheel(index_url: str, name: str, version: str, python: str, *, pins_file: PinsFile, frozen: bool,
              ca_bundle: Path | None = None) -> str:
    """'<wheel URL>#sha256=<hex>' of name==version for CPython `python` (3.12) on Linux x86_64 from
    the index: from the pins file, else found on the index page now (the page's own #sha256= where
    it gives one, else the wheel downloaded once into the cache and hashed) and recorded."""
    from packaging.version import Version

    key = f"{index_url} {name}=={version} cp{python.replace('.', '')}"
    entry = pins_file.data.setdefault("wheels", {}).get(key)
    if entry is not None:
        return f"{entry['url']}#sha256={entry['sha256']}"
    if frozen:
        raise UserError(f"--frozen: {name}=={version} from {index_url} is not in the pins file {pins_file.path}; "
                        f"build once without --frozen, or --set torch.wheels.{name}='<wheel URL>#sha256=<64 hex>'")
    page = wheel_index.project_url(index_url, name)
    interp = f"cp{python.replace('.', '')}"
    found = sorted((w for w in wheel_index.parse_page(*_fetch_text(page, ca_bundle))
                    if w.version == Version(version) and interp in w.interpreters and w.runs_on_linux_x86_64()),
                   key=lambda w: w.filename)
    if not found:
        raise UserError(f"{page}: no {name} {version} wheel for {interp} on Linux x86_64; "
                        f"check torch.{name} and torch.index_url (`toolbox bump torch` lists what is there)")
    wheel = found[0]
    how = "the index's own sha256"
    sha = wheel.sha256
    if sha is None:
        sha = download(wheel.url, cached_path(wheel.url), ca_bundle=ca_bundle)
        how = "downloaded once and hashed"
    pins_file.record("wheels", key, f"{wheel.filename} sha256 {sha} ({how}; recorded in {pins_file.path}, later "
                     "builds install exactly these bytes: pip checks the hash)", url=wheel.url, sha256=sha)
    return f"{wheel.url}#sha256={sha}"


Probe = Callable[[str], str]


def engine_digest(engine: str) -> Probe:
    """Pull ref with the engine's CLI and return its registry digest (sha256:...)."""

    def probe(ref: str) -> str:
        exe = shutil.which(engine)
        if exe is None:
            raise ToolError(f"{engine} not found: cannot resolve the digest of {ref}")
        pull = subprocess.run([exe, "pull", "-q", ref], capture_output=True, text=True)
        if pull.returncode != 0:
            last = (pull.stderr.strip().splitlines() or ["?"])[-1]
            raise ToolError(f"network: cannot pull {ref} to pin its digest on first use: {last} "
                            "(or pin it yourself: --set base.digest=sha256:<64 hex>)")
        out = subprocess.run([exe, "image", "inspect", "--format", "{{json .RepoDigests}}", ref],
                             capture_output=True, text=True)
        name = ref.rsplit(":", 1)[0]
        for rd in json.loads(out.stdout or "[]") or []:
            if rd.startswith(name + "@sha256:"):
                return rd.split("@", 1)[1]
        raise ToolError(f"{engine} pulled {ref} but reports no registry digest for it")

    return probe


def pin_image(ref: str, *, pins_file: PinsFile, frozen: bool, probe: Probe) -> str:
    entry = pins_file.image(ref)
    if entry is not None:
        return entry["digest"]
    if frozen:
        raise UserError(f"--frozen: base image {ref} has no digest and is not in the pins file "
                        f"{pins_file.path}; build once without --frozen, or --set base.digest=sha256:<64 hex>")
    digest = probe(ref)
    pins_file.record("images", ref, f"{ref} digest {digest} (recorded in {pins_file.path})", digest=digest)
    return digest


@dataclass(frozen=True)
class PinUpdate:
    """One field of the stack set by a first-use pin: `path` as in the stack file, `value` typed."""

    path: tuple[str, ...]
    value: str | bool


class Pinner:
    """What a component's first-use hook pins with: the pins file, --frozen, the CA bundle and the
    base image's probe, bound once for the whole stack."""

    manifest = MANIFEST

    def __init__(self, pins_file: PinsFile, frozen: bool, ca_bundle: Path | None, probe: Probe):
        self.pins_file, self.frozen, self.ca_bundle, self.probe = pins_file, frozen, ca_bundle, probe

    def tarball(self, url: str, rccl_commit: str | None) -> str:
        return pin_tarball(url, rccl_commit=rccl_commit, pins_file=self.pins_file, frozen=self.frozen,
                           ca_bundle=self.ca_bundle)

    def file(self, url: str, field: str) -> str:
        return pin_file(url, field, pins_file=self.pins_file, frozen=self.frozen, ca_bundle=self.ca_bundle)

    def wheel(self, index_url: str, name: str, version: str, python: str) -> str:
        return pin_wheel(index_url, name, version, python, pins_file=self.pins_file, frozen=self.frozen,
                         ca_bundle=self.ca_bundle)

    def image(self, ref: str) -> str:
        return pin_image(ref, pins_file=self.pins_file, frozen=self.frozen, probe=self.probe)

    def recorded(self, url: str) -> dict:
        """The pins file's entry of a file (empty: none)."""
        return self.pins_file.file(url) or {}

    @staticmethod
    def loud(msg: str) -> None:
        _loud(msg)


def first_use_pins(stack, *, frozen: bool = False, engine: str = "podman",
                   ca_bundle: Path | None = None, pins_file: PinsFile | None = None,
                   probe: Probe | None = None) -> list[PinUpdate]:
    """The updates pinning what the stack's components leave unpinned (fetching on first use), in
    the components' pin order."""
    pinner = Pinner(pins_file or PinsFile(), frozen, ca_bundle, probe or engine_digest(engine))
    return [PinUpdate(tuple(path), value) for comp in components.pinners(stack)
            for path, value in comp.first_use_pins(stack, pinner)]
