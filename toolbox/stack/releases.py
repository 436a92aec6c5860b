"""AMD's release indexes, for `toolbox bump` (the rocm and torch components' bump hooks reach them
through toolbox.stack.bumping's tools).

- TheRock tarballs: the newest stable (or --to VERSION, or --to MAJOR.MINOR for its newest stable
  release) tarball for the stack's first GPU target, found in the index page of the pinned URL's
  folder (tarball/ or, from ROCm 7.14, tarball-multi-arch/: same file names).
- torch: torch, torchvision and torchaudio at the newest (or --to X.Y[.Z]) torch built for the
  stack's ROCm (local tag +rocm<version>, compared exactly: as text +rocm10.0.0 sorts below
  +rocm7.15..., so "the newest" is only ever taken among one ROCm's builds) in its pip index;
  torchvision 0.(minor+15) as PyTorch pairs them, torchaudio at torch's version or the newest
  below it (ROCm 10.0: 2.11.0.2 with torch 2.13.0); torch.wheels URLs written in the stack file
  are re-pinned to the new files with the whole set coupled to them (device wheels, triton,
  rocm-sdk-*, the rocm sdist; not rocm-bootstrap and setuptools), as `bump rocm --to` writes a new
  line: each in the whl-next/<name>/<file> form (the index URL the stack names, not where it
  redirects), with the page's sha256 or the file downloaded and hashed; triton is the newest build
  of the stack's +rocm line (its build hash is not derived from torch's version). A set the file
  writes only in part (the rest inherited), or one the index lacks a file of, is refused in one
  line and nothing is written. ROCm 10's stable
  repository: tarballs in core/tarball/, wheels in whl-next/ (which redirects each project to
  pytorch/whl-next/ or core/whl-next/; links are resolved where the page is). A multi-arch index (torch.multi_arch, whl-multi-arch/) must also list
  amd-torch-device-<target> at that torch version for every GPU target.
- A new ROCm line: `--to 10.1` on a stack of ROCm 10.0 (each 10.x minor is a torch line of its
  own) writes a new stack beside it (gfx1151-rocm10.1) extending it, from that release's own files
  (new_line: each file hashed, the whole set the old stack pins at the new
  line's files in the whl-next/<name>/<file> form; rocm-bootstrap and setuptools keep their pins;
  a PyPI bitsandbytes becomes a build from its release tag where the new line's HIP differs).
"""

from __future__ import annotations

import re
import tempfile
import urllib.parse
from pathlib import Path
from typing import Callable

from packaging.utils import parse_sdist_filename
from packaging.version import InvalidVersion, Version

from toolbox.errors import ToolError, UserError
from toolbox.stack import wheel_index
from toolbox.stack.load import STACKS_DIR
from toolbox.stack.remote import NotFound, _open, resolve_git, sha256_url
from toolbox.stack.source import writes
from toolbox.components.values import UNCOUPLED


def resolve_tarball(index_url: str, target: str, to: str | None) -> tuple[str, str]:
    """(version, url) of the tarball for target: --to exactly, the newest stable MAJOR.MINOR.x for
    --to MAJOR.MINOR, else the newest stable listed (the newest of all when none is stable)."""
    base = index_url if index_url.endswith("/") else index_url + "/"
    with _open(base) as resp:
        page = resp.read().decode("utf-8", "replace")
    pat = re.compile(rf"therock-dist-linux-{re.escape(target)}-([0-9][0-9A-Za-z.]*)\.tar\.gz")
    found = {}
    for v in set(pat.findall(page)):
        try:
            found[v] = Version(v)
        except InvalidVersion:
            continue
    if not found:
        raise ToolError(f"{base}: lists no therock-dist-linux-{target}-*.tar.gz")
    listed = ", ".join(sorted(found, key=found.get))
    if to and to != "latest" and to not in found:
        series = re.fullmatch(r"(\d+)\.(\d+)", to)
        cands = [v for v in found if series and found[v].release[:2] == (int(series[1]), int(series[2]))
                 and not found[v].is_prerelease]
        if not cands:
            raise UserError(f"--to {to}: {base} has no tarball for {target} at that version (it lists {listed})")
        version = max(cands, key=found.get)
    elif to and to != "latest":
        version = to
    else:
        stable = [v for v in found if not found[v].is_prerelease]
        version = max(stable or found, key=found.get)
    return version, urllib.parse.urljoin(base, f"therock-dist-linux-{target}-{version}.tar.gz")


def _index_wheels(index_url: str, project: str) -> list[wheel_index.Wheel]:
    url = wheel_index.project_url(index_url, project)
    with _open(url) as resp:  # after redirects (whl-next/ -> pytorch/whl-next/, core/whl-next/)
        return wheel_index.parse_page(resp.read().decode("utf-8", "replace"), resp.geturl())


def resolve_torch(stack, index_url: str, to: str | None, rocm: str | None = None) -> dict[str, str]:
    """torch/torchvision/torchaudio versions for the stack's ROCm (or `rocm`: a new line's, whose
    wheels the stack file does not pin yet) from its pip index."""
    local = f"rocm{rocm or stack.model.rocm.version}"
    m = re.fullmatch(r"python(\d)\.(\d+)", stack.model.base.python or "")
    interp = f"cp{m[1]}{m[2]}" if m and stack.model.base.family == "fedora" else None
    torches = wheel_index.versions(_index_wheels(index_url, "torch"), local=local, interpreter=interp)
    if not torches:
        raise ToolError(f"{wheel_index.project_url(index_url, 'torch')}: no torch wheel +{local}"
                        + (f" for {interp}" if interp else "") + " (linux x86_64)")
    if to and to != "latest":
        want = Version(to) if re.fullmatch(r"\d+(\.\d+){1,2}", to) else None
        cands = [v for v in torches if want and (v.public == to or v.release[:len(want.release)] == want.release)]
        if not cands:
            raise UserError(f"--to {to}: no torch {to} +{local} in {index_url} "
                            f"(it lists {', '.join(str(v) for v in sorted(torches))})")
        torches = set(cands)
    torch = max(torches)
    out = {"torch.torch": str(torch)}
    if stack.model.torch.torchvision:
        vision = {v for v in wheel_index.versions(_index_wheels(index_url, "torchvision"), local=local, interpreter=interp)
                  if v.release[:2] == (0, torch.minor + 15)}
        if not vision:
            raise ToolError(f"{index_url}: no torchvision 0.{torch.minor + 15}.* +{local} to pair with torch {torch}")
        out["torch.torchvision"] = str(max(vision))
    if stack.model.torch.torchaudio:
        # torchaudio is built at torch's version up to ROCm 7.x; ROCm 10.0's index pairs torch
        # 2.13.0 with torchaudio 2.11.0.2 (same local tag): the same version where there is one,
        # else the newest not above torch's.
        audio = wheel_index.versions(_index_wheels(index_url, "torchaudio"), local=local, interpreter=interp)
        paired = {v for v in audio if v == torch} or {v for v in audio if v.release[:2] <= torch.release[:2]}
        if not paired:
            raise ToolError(f"{index_url}: no torchaudio +{local} to pair with torch {torch}")
        out["torch.torchaudio"] = str(max(paired))
    if rocm is None:
        out.update(_rewheel(stack, index_url, out, interp))
    if stack.model.torch.multi_arch:
        for target in stack.model.gpu_targets:
            device = f"amd-torch-device-{target}"
            if torch not in wheel_index.versions(_index_wheels(index_url, device)):
                raise ToolError(f"{index_url}: torch {torch} has no {device} {torch} (the GPU code of "
                                f"torch[device-{target}]); pick another with --to")
    return out


def _rewheel(stack, index_url: str, versions: dict[str, str], interp: str | None) -> dict[str, str]:
    """torch.wheels entries that the stack file writes, for the versions just resolved: torch's and
    every wheel coupled to it (a stale one would pin the old version's bytes, and the stack would
    be refused), from the stack's own ROCm line. Refused, naming them: a set the file writes in
    part, or files the index does not have."""
    path = stack.source
    names = [n for n in stack.model.torch.wheels if n not in UNCOUPLED]
    written = [n for n in names if writes(path, f"torch.wheels.{n}")]
    if not written:
        return {}
    inherited = [n for n in names if n not in written]
    if inherited:
        raise UserError(f"{path}: torch.wheels: bump torch re-pins the whole coupled set, and "
                        f"{', '.join(inherited)} {'is' if len(inherited) == 1 else 'are'} not written in this file "
                        "(inherited): write the whole set here, or bump the stack that pins it")
    rocm = stack.model.rocm.version
    found, missing = {}, []
    for n in written:
        want = _want(n, versions, rocm)
        ref = _wheel_ref(index_url, n, want, interp, missing_ok=True)
        if ref is None:
            missing.append(f"{n} {want.replace('*+', '*.')}")
        found[f"torch.wheels.{n}"] = ref
    if missing:
        raise UserError(f"{path}: bump torch to {versions['torch.torch']}: {index_url} lacks {'; '.join(missing)}"
                        f"{' (for ' + interp + ')' if interp else ''}: the coupled set would be partial; nothing written")
    return found


def tarball_facts(tarball: Path) -> tuple[str | None, str | None]:
    """(the rocm-systems commit its TheRock manifest names, HIP's major.minor from its libamdhip64.so.X.Y.Z)."""
    import tarfile

    from toolbox.stack.pinning import manifest_commit

    hip = None
    with tarfile.open(tarball, "r:*") as tf:
        for name in tf.getnames():
            m = re.search(r"(?:^|/)lib/libamdhip64\.so\.(\d+)\.(\d+)\.\d+$", name)
            if m:
                hip = f"{m[1]}.{m[2]}"
                break
    return manifest_commit(tarball), hip


def _want(name: str, versions: dict[str, str], rocm: str) -> str:
    """The version of `name` on the new line ('*' + local: triton, whose build hash no pin names)."""
    torch, vision = versions["torch.torch"], versions.get("torch.torchvision", "")
    local = torch.partition("+")[2]
    if name in ("torch", "torchvision", "torchaudio"):
        return versions[f"torch.{name}"]
    if name.startswith("amd-torchvision-device-"):
        return vision
    if name.startswith("amd-torch-device-"):
        return torch
    return f"*+{local}" if name == "triton" else rocm  # rocm-sdk-*, the rocm sdist


def _wheel_ref(index_url: str, name: str, want: str, interp: str | None, missing_ok: bool = False) -> str | None:
    """'<index>/<name>/<file>#sha256=<hex>' of the new line's file for `name` (None where the index
    has none and `missing_ok`)."""
    try:
        return _find_ref(index_url, name, want, interp, missing_ok)
    except NotFound:
        if missing_ok:
            return None
        raise


def _find_ref(index_url: str, name: str, want: str, interp: str | None, missing_ok: bool) -> str | None:
    if name == "rocm":  # an sdist: the page's .tar.gz link
        url = wheel_index.project_url(index_url, name)
        with _open(url) as resp:
            page, at = resp.read().decode("utf-8", "replace"), resp.geturl()
        files = [f for f in re.findall(r'href="([^"#]+\.tar\.gz)', page)
                 if str(parse_sdist_filename(urllib.parse.unquote(f.rsplit("/", 1)[-1]))[1]) == want]
        if not files:
            if missing_ok:
                return None
            raise ToolError(f"{url}: no rocm {want} sdist to pin torch.wheels.rocm by")
        file, link = urllib.parse.unquote(files[0].rsplit("/", 1)[-1]), urllib.parse.urljoin(at, files[0])
        sha = None
    else:
        found = sorted((w for w in _index_wheels(index_url, name) if w.runs_on_linux_x86_64()
                        and (interp is None or {interp, "py3"} & w.interpreters)
                        and (w.version == Version(want) if not want.startswith("*+")
                             else f".{w.version.local}".endswith(f".{want[2:]}"))), key=lambda w: w.version)
        if not found:
            if missing_ok:
                return None
            raise ToolError(f"{wheel_index.project_url(index_url, name)}: no {name} {want} wheel"
                            + (f" for {interp}" if interp else "") + " (linux x86_64) to pin torch.wheels by")
        file, link, sha = found[-1].filename, found[-1].url, found[-1].sha256
    ref = urllib.parse.urljoin(wheel_index.project_url(index_url, name), urllib.parse.quote(file))
    return f"{ref}#sha256={sha or sha256_url(link)}"


def new_line(path: Path, stack, version: str, url: str, write: Callable[[Path, str], None]) -> dict[str, object]:
    """The new stack file beside `path`, extending it (it is validated before it is written).
    AMD's index publishes no sha256s: each file is downloaded and hashed here; `write` writes it
    once it loads as a stack (toolbox.stack.bumping's)."""
    from toolbox.stack.pinning import download

    old, new = ".".join(stack.model.rocm.version.split(".")[:2]), ".".join(version.split(".")[:2])
    name = stack.model.name.replace(f"rocm{old}", f"rocm{new}")
    name = name if name != stack.model.name else f"{name}-rocm{new}"
    out = path.with_name(f"{name}.yaml")
    if out.exists():
        raise UserError(f"{out}: exists already; bump it in place (`toolbox bump rocm --stack {out}`) or remove it")
    with tempfile.TemporaryDirectory(prefix="toolbox-bump-") as tmp:
        sha = download(url, Path(tmp) / "rocm.tar.gz")
        commit, hip = tarball_facts(Path(tmp) / "rocm.tar.gz")
    if stack.model.rccl is not None and commit is None:
        raise ToolError(f"{url}: its TheRock manifest names no rocm-systems commit: RCCL's cannot be taken from it")
    index = stack.model.torch.index_url
    torch = resolve_torch(stack, index, None, rocm=version)  # (the bump's index_url is the tarballs')
    m = re.fullmatch(r"python(\d)\.(\d+)", stack.model.base.python or "")
    interp = f"cp{m[1]}{m[2]}" if m and stack.model.base.family == "fedora" else None
    wheels = {n: (ref if n in UNCOUPLED else _wheel_ref(index, n, _want(n, torch, version), interp))
              for n, ref in stack.model.torch.wheels.items()}
    parent = stack.model.name if path.resolve().parent == STACKS_DIR.resolve() else path.name
    q = lambda v: f'"{v}"'
    lines = [f"# Written by `toolbox bump rocm --to {new}` from {path.name}: ROCm {version}'s tarball (sha256",
             "# hashed on download), RCCL at the rocm-systems commit its TheRock manifest names, HIP as its",
             f"# libamdhip64 names it, torch and the wheels coupled to it from {index}, each file hashed.",
             f"extends: {parent}", f"name: {name}", f"description: {stack.model.description.replace(old, new)}",
             "rocm:", f"  version: {q(version)}"]
    lines += [f"  hip_version: {q(hip)}"] if hip else []
    lines += ["  tarball:", f"    url: {url}", f"    sha256: {sha}", "    unverified: false"]
    lines += ["rccl:", f"  commit: {commit}"] if stack.model.rccl is not None else []
    lines += ["torch:"] + [f"  {k.split('.', 1)[1]}: {q(v)}" for k, v in torch.items()]
    lines += ["  wheels:"] + [f"    {n}: {ref}" for n, ref in wheels.items()] if wheels else []
    b, built = stack.model.bitsandbytes, {}
    if b is not None and b.source == "pypi" and hip and hip != stack.model.rocm.hip:
        # A released wheel has libraries for the HIPs it was built against, and a fallback to
        # another HIP's was seen crashing: the new HIP gets its own build, from the release's tag.
        built = {"bitsandbytes.commit": resolve_git(b.repo, b.version)}
        lines += ["bitsandbytes:", f"  # built for HIP {hip} from tag {b.version} ({parent}'s wheel is for HIP {stack.model.rocm.hip})",
                  "  source: git", f"  repo: {b.repo}", f"  commit: {built['bitsandbytes.commit']}",
                  f"  version: {q(b.version)}", "  wheel_sha256: null"]
    text = "\n".join(lines) + "\n"
    write(out, text)
    return {"stack": str(out), "rocm.version": version, "rocm.tarball.sha256": sha, "rocm.hip_version": hip,
            "rccl.commit": commit, **torch, **built}
