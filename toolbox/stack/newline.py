"""`toolbox bump rocm --to 10.1` on a ROCm 10.0 stack: a new stack file for that ROCm line.

Each ROCm 10 minor is a torch line of its own (+rocm10.0.0, +rocm10.1.0), so the bump writes a
stack beside the old one (gfx1151-rocm10.1, extending gfx1151-rocm10.0) from that release's own
files: the tarball's sha256 (hashed on download), RCCL at the rocm-systems commit its TheRock
manifest names, HIP's version from its libamdhip64, torch/torchvision/torchaudio of the exact
line from torch.index_url, and every wheel the old stack pins by URL (the whole ROCm set) at the
new line's file in the whl-next/<name>/<file> form, each hashed (the page's sha256 or the file
downloaded); rocm-bootstrap and setuptools, which no line versions, keep the old stack's pins.
"""

from __future__ import annotations

import re
import tempfile
import urllib.parse
from pathlib import Path

from packaging.utils import parse_sdist_filename
from packaging.version import Version

from toolbox.errors import ToolError, UserError
from toolbox.files import atomic_write
from toolbox.stack import wheel_index
from toolbox.stack.bump import _index_wheels, _open, resolve_torch, sha256_url
from toolbox.stack.load import STACKS_DIR, load_stack
from toolbox.stack.values import UNCOUPLED


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


def _wheel_ref(index_url: str, name: str, want: str, interp: str | None) -> str:
    """'<index>/<name>/<file>#sha256=<hex>' of the new line's file for `name`."""
    if name == "rocm":  # an sdist: the page's .tar.gz link
        url = wheel_index.project_url(index_url, name)
        with _open(url) as resp:
            page, at = resp.read().decode("utf-8", "replace"), resp.geturl()
        files = [f for f in re.findall(r'href="([^"#]+\.tar\.gz)', page)
                 if str(parse_sdist_filename(urllib.parse.unquote(f.rsplit("/", 1)[-1]))[1]) == want]
        if not files:
            raise ToolError(f"{url}: no rocm {want} sdist to pin torch.wheels.rocm by")
        file, link = urllib.parse.unquote(files[0].rsplit("/", 1)[-1]), urllib.parse.urljoin(at, files[0])
        sha = None
    else:
        found = sorted((w for w in _index_wheels(index_url, name) if w.runs_on_linux_x86_64()
                        and (interp is None or {interp, "py3"} & w.interpreters)
                        and (w.version == Version(want) if not want.startswith("*+")
                             else f".{w.version.local}".endswith(f".{want[2:]}"))), key=lambda w: w.version)
        if not found:
            raise ToolError(f"{wheel_index.project_url(index_url, name)}: no {name} {want} wheel"
                            + (f" for {interp}" if interp else "") + " (linux x86_64) to pin torch.wheels by")
        file, link, sha = found[-1].filename, found[-1].url, found[-1].sha256
    ref = urllib.parse.urljoin(wheel_index.project_url(index_url, name), urllib.parse.quote(file))
    return f"{ref}#sha256={sha or sha256_url(link)}"


def new_line(path: Path, stack, version: str, url: str) -> dict[str, object]:
    """The new stack file beside `path`, extending it (it is validated before it is written).
    AMD's index publishes no sha256s: each file is downloaded and hashed here."""
    from toolbox.stack.pinning import download

    old, new = ".".join(stack.rocm.version.split(".")[:2]), ".".join(version.split(".")[:2])
    name = stack.model.name.replace(f"rocm{old}", f"rocm{new}")
    name = name if name != stack.model.name else f"{name}-rocm{new}"
    out = path.with_name(f"{name}.yaml")
    if out.exists():
        raise UserError(f"{out}: exists already; bump it in place (`toolbox bump rocm --stack {out}`) or remove it")
    with tempfile.TemporaryDirectory(prefix="toolbox-bump-") as tmp:
        sha = download(url, Path(tmp) / "rocm.tar.gz")
        commit, hip = tarball_facts(Path(tmp) / "rocm.tar.gz")
    if stack.rccl is not None and commit is None:
        raise ToolError(f"{url}: its TheRock manifest names no rocm-systems commit: RCCL's cannot be taken from it")
    index = stack.torch.index_url
    torch = resolve_torch(stack, index, None, rocm=version)  # (the bump's index_url is the tarballs')
    m = re.fullmatch(r"python(\d)\.(\d+)", stack.base.python or "")
    interp = f"cp{m[1]}{m[2]}" if m and stack.base.family == "fedora" else None
    wheels = {n: (ref if n in UNCOUPLED else _wheel_ref(index, n, _want(n, torch, version), interp))
              for n, ref in stack.torch.wheels.items()}
    parent = stack.model.name if path.resolve().parent == STACKS_DIR.resolve() else path.name
    q = lambda v: f'"{v}"'
    lines = [f"# Written by `toolbox bump rocm --to {new}` from {path.name}: ROCm {version}'s tarball (sha256",
             "# hashed on download), RCCL at the rocm-systems commit its TheRock manifest names, HIP as its",
             f"# libamdhip64 names it, torch and the wheels coupled to it from {index}, each file hashed.",
             f"extends: {parent}", f"name: {name}", f"description: {stack.model.description.replace(old, new)}",
             "rocm:", f"  version: {q(version)}"]
    lines += [f"  hip_version: {q(hip)}"] if hip else []
    lines += ["  tarball:", f"    url: {url}", f"    sha256: {sha}", "    unverified: false"]
    lines += ["rccl:", f"  commit: {commit}"] if stack.rccl is not None else []
    lines += ["torch:"] + [f"  {k.split('.', 1)[1]}: {q(v)}" for k, v in torch.items()]
    lines += ["  wheels:"] + [f"    {n}: {ref}" for n, ref in wheels.items()] if wheels else []
    text = "\n".join(lines) + "\n"
    tmp = out.with_name(f".{out.name}.bump")
    tmp.write_text(text, encoding="utf-8")
    try:
        load_stack(str(tmp))
    finally:
        tmp.unlink(missing_ok=True)
    atomic_write(out, text)
    return {"stack": str(out), "rocm.version": version, "rocm.tarball.sha256": sha, "rocm.hip_version": hip,
            "rccl.commit": commit, **torch}
