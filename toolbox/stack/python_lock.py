"""One lock per stack for everything Python: `toolbox lock --stack S` (issue 12, item 4).

The stack pins its top-level packages (torch, the HF stack); their dependencies (tokenizers,
huggingface_hub, safetensors, numpy, ...) would float. uv (a maintained resolver, from PyPI)
resolves the image's whole Python set for the image's platform and Python into
`<stack>.pylock.txt` beside the stack file: every version with the sha256 of every file PyPI
serves for it (a find-links wheel, like the cpu stack's local torch +cpu, is hashed from the
file). The image then installs with `pip --require-hashes --no-deps` from it: torch and its
dependencies in the torch step, the rest in the HF step, so a tampered or swapped file fails
the build. The lock's sha256 is a pin, hence part of the image tag.

The lock records the digest of its inputs; a stack whose pins moved on (`--set hf.peft=...`)
no longer matches it: `toolbox build` refuses it (exit 2) unless --unlocked, and
`toolbox lock --stack S --set ...` locks that pin set into the user's state
($XDG_STATE_HOME/toolbox/pylocks/, keyed by the inputs), where the build finds it.
Wheels from an index only the user's network reaches (AMD's torch) are left out of the
resolution and named under `# first-use:` in the lock; what a stack builds from git (Unsloth,
bitsandbytes on ROCm) is not in it either: their steps install them, and what they pull in,
without hashes. PyPI Unsloth on ROCm is in it, less what its wheels require that the image takes
elsewhere (`# left out:`: the ROCm torch's triton, CUDA-only xformers, a git-built bitsandbytes).
"""

from __future__ import annotations

import hashlib
import re
import shutil
import subprocess
import sys
import tempfile
import tomllib
from dataclasses import dataclass
from pathlib import Path

from toolbox.errors import ToolError, UserError
from toolbox.files import atomic_write
from toolbox.paths import PROJECT_ROOT, STACKS_DIR, state_dir
from toolbox.stack import statefiles

PLATFORM = "x86_64-manylinux_2_28"
# The interpreter the image's /opt/venv is made with: Debian bookworm's python3 is 3.11.
DEBIAN_PYTHON = {"bookworm": "3.11", "bookworm-slim": "3.11", "trixie": "3.13", "trixie-slim": "3.13"}
INPUTS_RE = re.compile(r"^# inputs: ([0-9a-f]{64})$", re.M)
TORCH_INPUTS_RE = re.compile(r"^# torch inputs: ([0-9a-f]{64})$", re.M)


def lock_path(stack) -> Path:
    """The checked-in lock, beside the stack file: for the file's own pins."""
    return stack.source.parent / f"{stack.source.stem}.pylock.txt"


def user_lock_path(stack) -> Path:
    """The lock of a pin set that --set made: in the user's state, keyed by its inputs."""
    return state_dir() / "pylocks" / f"{stack.source.stem}-{inputs_digest(stack)[:16]}.pylock.txt"


def python_version(stack) -> str:
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


def _entrypoint_deps() -> list[str]:
    """What the image's entrypoints package declares (installed --no-deps; `pip check` holds it to these)."""
    doc = tomllib.loads((PROJECT_ROOT / "entrypoints" / "pyproject.toml").read_text())
    return list(doc["project"]["dependencies"])


def first_use(stack) -> list[str]:
    """torch's pins where AMD's index serves them: only the user's network reaches it."""
    from toolbox.components import torch

    m = stack.model
    return torch.requirements(stack) if m.platform == "rocm" and m.torch.index_url else []


def left_out(stack) -> dict[str, str]:
    """What PyPI Unsloth requires that a ROCm image takes elsewhere (toolbox.components.unsloth):
    left out of the resolution, as first_use() is, and named in the lock's header."""
    from toolbox.components import unsloth

    return unsloth.left_out(stack)


def requirements(stack) -> list[str]:
    """torch's (unless first-use), the HF stack's, PyPI Unsloth's and PyPI bitsandbytes' pins,
    llama.cpp's converter's sentencepiece, plus what the entrypoints declare."""
    from toolbox.components import hf, torch

    pinned = ([] if first_use(stack) else torch.requirements(stack)) + hf.requirements(stack)
    u = stack.model.unsloth
    if u is not None and u.source == "pypi":
        extras = f"[{','.join(sorted(u.extras))}]" if u.extras else ""
        pinned += [f"unsloth{extras}=={u.version}", f"unsloth-zoo=={u.zoo_version}"]
    b = stack.model.bitsandbytes
    if b is not None and stack.model.platform == "rocm" and b.source == "pypi":
        pinned.append(f"bitsandbytes=={b.version}")
    lc = getattr(stack.model, "llama_cpp", None)
    if lc is not None and lc.sentencepiece:
        pinned.append(f"sentencepiece=={lc.sentencepiece}")  # llama.cpp's converter imports it
    if stack.model.ray is not None:
        pinned.append(f"ray[train]=={stack.model.ray.version}")  # its own layer: see only()
    names = {re.split(r"[\[=<>!~ ]", r, maxsplit=1)[0].lower() for r in pinned}
    extra = [d for d in _entrypoint_deps() if re.split(r"[\[=<>!~ ]", d, maxsplit=1)[0].lower() not in names]
    return sorted(pinned + extra)


def inputs_digest(stack, part: str = "all") -> str:
    """What the lock (part "all") or its torch part (part "torch": torch's own pins) was made from."""
    from toolbox.components import torch

    if part == "all":
        reqs = requirements(stack) + [f"first-use {r}" for r in first_use(stack)]
        reqs += [f"left-out {n}" for n in left_out(stack)]
    else:
        reqs = [] if first_use(stack) else torch.requirements(stack)
    blob = "\n".join([*reqs, f"platform={PLATFORM}", f"python={python_version(stack)}",
                      f"index={stack.model.torch.index_url or ''}"])
    return hashlib.sha256(blob.encode()).hexdigest()


def lock_command(stack) -> str:
    """The `toolbox lock` that writes this stack's lock: --stack its name when shipped, else its
    file, and the --set options it was loaded with."""
    ref = stack.source.stem if stack.source.parent == STACKS_DIR.resolve() else str(stack.source)
    sets = dict.fromkeys(src for src, _ in stack.origin.lines.values() if src.startswith("--set "))
    return " ".join(["toolbox lock --stack", ref, *sets])


def content_digest(path: Path) -> str:
    """The sha256 of a lock without its `# checksum:` line (the pin that goes into the image tag:
    the same as before locks carried a checksum)."""
    return hashlib.sha256(statefiles.without_checksum(path.read_bytes().decode("utf-8")).encode()).hexdigest()


def _holds_pins(stack, path: Path, lock: statefiles.PythonLock) -> None:
    """A lock made from these pins holds each of them: else it was edited, or cut short."""
    from packaging.version import InvalidVersion, Version

    for req in requirements(stack):
        name, sep, version = req.partition("==")
        if not sep:
            continue  # the entrypoints' ranges: uv picked within them
        name = re.split(r"\[", name, maxsplit=1)[0].lower().replace("_", "-")
        got = lock.packages.get(name)
        try:
            same = got is not None and Version(got.version) == Version(version)
        except InvalidVersion:
            same = got is not None and got.version == version
        if not same:
            raise statefiles.Damaged(path, "Python lock", f"it does not hold {name}=={version}, which the stack pins",
                                     statefiles.lock_regenerate(path, lock_command(stack)))


def _matches(stack, part: str) -> Path | None:
    """The checked-in lock, else the user's lock of this pin set, made from these inputs; a
    damaged one is refused (toolbox.stack.statefiles), not read as "made for other pins"."""
    if part == "torch" and first_use(stack):
        return None  # no torch part: AMD's wheels are not in the lock
    for p in (lock_path(stack), user_lock_path(stack)):
        if p.exists() or p.is_symlink():
            _, lock = statefiles.load_lock(p, lock_command(stack))
            if (lock.inputs if part == "all" else lock.torch_inputs) == inputs_digest(stack, part):
                if part == "all":
                    _holds_pins(stack, p, lock)
                return p
    return None


def current(stack) -> Path | None:
    """The stack's lock when it exists and was made from the stack's current pins."""
    return _matches(stack, "all")


def torch_current(stack) -> Path | None:
    """The lock when at least its torch part still holds (only later pins, e.g. hf.*, moved):
    the torch step stays locked, and its cached layer stays valid."""
    return _matches(stack, "torch")


@dataclass(frozen=True)
class LockState:
    """The stack's Python lock as a build uses it, read once per resolved stack (stack.load sets it
    as `stack.python_lock`): the lock made from the stack's pins and the one whose torch part still
    holds (None: none), the texts the image's pip steps install (components.pylock puts them in the
    build context: the torch part, the rest less what only ray pulls in, ray's part), and the pin."""

    whole: Path | None
    torch: Path | None
    torch_part: str | None
    everything: str | None
    ray_part: str | None
    digest: str | None  # content_digest(whole): python.lock.sha256


def state(stack) -> LockState:
    """The stack's LockState, from the lock files as they are now."""
    torch_lock, whole = torch_current(stack), current(stack)
    torch_part = split(torch_lock.read_text(encoding="utf-8"))[0] if torch_lock else None
    everything = ray = digest = None
    if whole:
        text = whole.read_text(encoding="utf-8")
        ray_only = only(text, "ray") if stack.model.ray is not None else set()
        everything = split(text, keep=lambda n: n not in ray_only)[1]
        ray = split(text, keep=lambda n: n in ray_only)[1] if stack.model.ray is not None else None
        digest = content_digest(whole)
    return LockState(whole, torch_lock, torch_part or None, everything, ray, digest)


def check(stack, ref: str | None, overrides=(), unlocked: bool = False) -> str | None:
    """Refuse a stale lock (UserError, one line); with `unlocked`, or for a stack never locked,
    the warning line to print instead (None when the lock holds)."""
    p, lock = lock_path(stack), stack.python_lock
    if lock.whole is not None:
        return None
    if not p.is_file():
        return (f"toolbox: warning: stack {stack.model.name} has no Python lock ({p}): its dependencies "
                f"float and are not hash-checked (`toolbox lock --stack {ref or stack.model.name}` writes one)")
    cmd = " ".join(["toolbox lock --stack", ref or stack.model.name, *(f"--set {o}" for o in overrides)])
    if not unlocked:
        raise UserError(f"{p}: the Python lock is for other pins than this build's: run `{cmd}` "
                        "(or build --unlocked: no hash checks)")
    part = " (its torch part still holds and is used)" if lock.torch else ""
    return (f"toolbox: warning: {p} was made for other pins{part}; this build installs the rest "
            f"unlocked (`{cmd}` locks this set)")


def parse(text: str) -> dict[str, dict]:
    """{name: {"block": requirement lines, "via": {parents}}} of a uv/pip-compile lock."""
    out: dict[str, dict] = {}
    name = None
    in_via = False
    for line in text.splitlines():
        m = re.match(r"^([A-Za-z0-9][A-Za-z0-9._-]*)(\[[^\]]*\])?==\S+", line)
        if m:
            name = m.group(1).lower().replace("_", "-")
            out[name] = {"block": [line], "via": set()}
            in_via = False
            continue
        if name is None:
            continue
        s = line.strip()
        if s.startswith("--hash="):
            out[name]["block"].append(line)
        elif s.startswith("# via"):
            rest = s[len("# via"):].strip()
            in_via = not rest
            if rest:
                out[name]["via"].add(rest.lower())
        elif in_via and s.startswith("#   "):
            out[name]["via"].add(s[4:].strip().lower())
        else:
            in_via = False
    return out


def split(text: str, first: str = "torch", keep=lambda name: True) -> tuple[str, str]:
    """(lock lines of `first` and everything it pulls in, lock lines of all that `keep`) for the pip steps."""
    pkgs = parse(text)
    closure = {first}
    grew = True
    while grew:
        grew = False
        for n, p in pkgs.items():
            if n not in closure and p["via"] & closure:
                closure.add(n)
                grew = True

    def body(names) -> str:
        return "".join("\n".join(pkgs[n]["block"]) + "\n" for n in sorted(names))

    return body(n for n in pkgs if n in closure), body(n for n in pkgs if keep(n))


def only(text: str, root: str) -> set[str]:
    """The packages of the lock that only `root` pulls in (each one's every parent is among them):
    what a layer of its own for `root` installs, and the rest of the lock leaves out."""
    pkgs = parse(text)
    if root not in pkgs:
        return set()
    mine = {root}
    grew = True
    while grew:
        grew = False
        for n, p in pkgs.items():
            if n not in mine and p["via"] and p["via"] <= mine:
                mine.add(n)
                grew = True
    return mine


def compile_lock(stack, *, find_links: list[Path], uv: str | None = None, upgrade: bool = False,
                 user: bool = False) -> Path:
    """Resolve the stack's Python set with uv and write <stack>.pylock.txt (atomically); `user`:
    the user's lock of a --set pin set instead of the checked-in one."""
    uv = uv or shutil.which("uv") or str(Path(sys.executable).with_name("uv"))
    if not Path(uv).exists() and not shutil.which(uv):
        raise ToolError("toolbox lock needs uv: pip install 'strix-toolbox[lock]' (or pip install uv)")
    if "+" not in stack.model.torch.torch:
        # A plain version (cuda's 2.13.0) is PyPI's wheel; a local +cpu wheel must not stand in for it.
        find_links = []
    reqs = requirements(stack)
    py = python_version(stack)
    cmd = [uv, "pip", "compile", "-", "--python-platform", PLATFORM, "--python-version", py,
           "--generate-hashes", "--no-header", "--quiet", "--annotation-style=split"]
    # As the image's pip.sh: a torch wheel in the find-links wins, and its index is not asked.
    local_torch = any(any(Path(d).glob("torch-*.whl")) for d in find_links)
    if stack.model.torch.index_url and not local_torch:
        cmd += ["--extra-index-url", stack.model.torch.index_url, "--index-strategy", "unsafe-best-match"]
    for d in find_links:
        cmd += ["--find-links", str(d)]
    if upgrade:
        cmd.append("--upgrade")
    with tempfile.TemporaryDirectory(prefix="toolbox-lock-") as tmp:
        if first_use(stack) or left_out(stack):
            # An override no platform matches drops torch from the resolution (HF packages need
            # it): AMD's wheels cannot be resolved here, and PyPI's torch must not stand in. So
            # too what PyPI Unsloth requires that the ROCm image takes elsewhere (triton, ...).
            names = sorted({re.split(r"[\[=]", r, maxsplit=1)[0] for r in first_use(stack)} | set(left_out(stack)))
            (Path(tmp) / "first-use.txt").write_text("".join(f"{n} ; python_version < '0'\n" for n in names))
            cmd += ["--overrides", str(Path(tmp) / "first-use.txt")]
        cp = subprocess.run(cmd, input="\n".join(reqs) + "\n", capture_output=True, text=True)
    if cp.returncode != 0:
        lines = [line.strip() for line in cp.stderr.strip().splitlines()]
        why = "; ".join(dict.fromkeys(lines[:3] + lines[-1:]))[:600]  # what failed, where, and why
        hint = ""
        if stack.model.torch.index_url and not local_torch and not first_use(stack):
            hint = (f" (torch {stack.model.torch.torch} is looked up on {stack.model.torch.index_url}; where that is not "
                    "reachable, --find-links DIR with its wheel)")
        raise ToolError(f"uv pip compile failed for stack {stack.model.name}: {why}{hint}")
    body = cp.stdout.replace("# via -r -", "# via (stack)").replace("#   -r -", "#   (stack)")
    header = (f"# The whole Python set of the {stack.model.name} image, for {PLATFORM} / Python {py}.\n"
              f"# Written by `toolbox lock --stack {stack.model.name}` (uv pip compile --generate-hashes);\n"
              "# the image installs it with pip --require-hashes. Do not edit: re-run toolbox lock / toolbox bump.\n"
              f"# inputs: {inputs_digest(stack)}\n"
              f"# torch inputs: {inputs_digest(stack, 'torch')}\n")
    for r in first_use(stack):
        name = re.split(r"[\[=]", r, maxsplit=1)[0]
        how = ("installed by the stack's torch.wheels URL, whose sha256 pip checks" if name in stack.model.torch.wheels
               else "installed without a hash check")
        header += f"# first-use: {r} from {stack.model.torch.index_url}: not reachable when locking; {how}\n"
    for name, why in left_out(stack).items():
        header += f"# left out: {name}, which PyPI Unsloth requires: {why}\n"
    out = user_lock_path(stack) if user else lock_path(stack)
    out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(out, statefiles.with_checksum(header + body))
    return out
