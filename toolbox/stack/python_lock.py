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

Each active component says what it adds through its `lock` hook (toolbox.components.LockPart):
its requirements, what is first-use or left out, the extra index, the part of the lock its own
image step installs first (torch's) and the one that is a layer of its own (ray's). Nothing here
names a component.
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

from toolbox import components
from toolbox.errors import ToolError, UserError
from toolbox.files import atomic_write
from toolbox.paths import PROJECT_ROOT, STACKS_DIR, state_dir
from toolbox.stack import statefiles

PLATFORM = "x86_64-manylinux_2_28"
INPUTS_RE = re.compile(r"^# inputs: ([0-9a-f]{64})$", re.M)
TORCH_INPUTS_RE = re.compile(r"^# torch inputs: ([0-9a-f]{64})$", re.M)


def lock_path(stack) -> Path:
    """The checked-in lock, beside the stack file: for the file's own pins."""
    return stack.source.parent / f"{stack.source.stem}.pylock.txt"


def user_lock_path(stack) -> Path:
    """The lock of a pin set that --set made: in the user's state, keyed by its inputs."""
    return state_dir() / "pylocks" / f"{stack.source.stem}-{inputs_digest(stack)[:16]}.pylock.txt"


def python_version(stack) -> str:
    """The image's Python ("3.12"), from the component that knows it (the base's `interpreter`)."""
    return components.python_version(stack)


def _entrypoint_deps() -> list[str]:
    """What the image's entrypoints package declares (installed --no-deps; `pip check` holds it to these)."""
    doc = tomllib.loads((PROJECT_ROOT / "entrypoints" / "pyproject.toml").read_text())
    return list(doc["project"]["dependencies"])


def _first_use_notes(stack) -> dict[str, str]:
    return {r: note for part in components.lock_parts(stack) for r, note in part.first_use.items()}


def first_use(stack) -> list[str]:
    """Pins an index serves that only the user's network reaches (AMD's torch wheels): left out."""
    return list(_first_use_notes(stack))


def left_out(stack) -> dict[str, str]:
    """What a component's wheels require that the image takes elsewhere (PyPI Unsloth's on ROCm):
    left out of the resolution, as first_use() is, and named in the lock's header."""
    return dict(sorted((n, why) for part in components.lock_parts(stack) for n, why in part.left_out.items()))


def _index(stack) -> str | None:
    """The extra index the resolution asks (torch's), if a component names one."""
    return next((p.index_url for p in components.lock_parts(stack) if p.index_url), None)


def _first(stack) -> components.LockPart | None:
    """The part whose closure the image installs first, from its own part of the lock (torch's)."""
    return next((p for p in components.lock_parts(stack) if p.first), None)


def requirements(stack) -> list[str]:
    """Every component's lock requirements (torch's unless first-use, the HF stack's, PyPI
    Unsloth's and bitsandbytes', llama.cpp's converter's sentencepiece, ray's), plus what the
    entrypoints declare."""
    pinned = [r for part in components.lock_parts(stack) for r in part.requirements]
    names = {re.split(r"[\[=<>!~ ]", r, maxsplit=1)[0].lower() for r in pinned}
    extra = [d for d in _entrypoint_deps() if re.split(r"[\[=<>!~ ]", d, maxsplit=1)[0].lower() not in names]
    return sorted(pinned + extra)


def inputs_digest(stack, part: str = "all") -> str:
    """What the lock (part "all") or its first part (any other: the pins of the component whose
    closure the image installs first, torch's) was made from."""
    if part == "all":
        reqs = requirements(stack) + [f"first-use {r}" for r in first_use(stack)]
        reqs += [f"left-out {n}" for n in left_out(stack)]
    else:
        first = _first(stack)
        reqs = [] if first is None else list(first.requirements)
    blob = "\n".join([*reqs, f"platform={PLATFORM}", f"python={python_version(stack)}",
                      f"index={_index(stack) or ''}"])
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
    if part != "all" and (first_use(stack) or _first(stack) is None):
        return None  # no first part: AMD's wheels are not in the lock
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
    """The lock when at least its first part (torch's) still holds (only later pins, e.g. hf.*,
    moved): the torch step stays locked, and its cached layer stays valid."""
    return _matches(stack, "first")


@dataclass(frozen=True)
class LockState:
    """The stack's Python lock as a build uses it, read once per resolved stack (stack.load sets it
    as `stack.python_lock`): the lock made from the stack's pins and the one whose torch part still
    holds (None: none), the texts the image's pip steps install (components.pylock puts them in the
    build context: the first part (torch's), the rest less what the own-layer part pulls in alone,
    that part (ray's)), and the pin."""

    whole: Path | None
    torch: Path | None
    torch_part: str | None
    everything: str | None
    ray_part: str | None
    digest: str | None  # content_digest(whole): python.lock.sha256


def state(stack) -> LockState:
    """The stack's LockState, from the lock files as they are now."""
    first = _first(stack)
    own = next((p.own_layer for p in components.lock_parts(stack) if p.own_layer), None)
    torch_lock, whole = torch_current(stack), current(stack)
    torch_part = split(torch_lock.read_text(encoding="utf-8"), first.first)[0] if torch_lock else None
    everything = ray = digest = None
    if whole:
        text = whole.read_text(encoding="utf-8")
        root = first.first if first else ""
        ray_only = only(text, own) if own else set()
        everything = split(text, root, keep=lambda n: n not in ray_only)[1]
        ray = split(text, root, keep=lambda n: n in ray_only)[1] if own else None
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
    parts = components.lock_parts(stack)
    if not all(p.local_wheels for p in parts):
        # A plain version (cuda's torch 2.13.0) is PyPI's wheel; a local +cpu wheel must not stand in for it.
        find_links = []
    reqs = requirements(stack)
    py = python_version(stack)
    cmd = [uv, "pip", "compile", "-", "--python-platform", PLATFORM, "--python-version", py,
           "--generate-hashes", "--no-header", "--quiet", "--annotation-style=split"]
    # As the image's pip.sh: a wheel of the first part (torch) in the find-links wins, and its index is not asked.
    first, index = _first(stack), _index(stack)
    local_first = first is not None and any(any(Path(d).glob(f"{first.first}-*.whl")) for d in find_links)
    if index and not local_first:
        cmd += ["--extra-index-url", index, "--index-strategy", "unsafe-best-match"]
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
        cp = _run(cmd, "\n".join(reqs) + "\n")
    if cp.returncode != 0:
        lines = [line.strip() for line in cp.stderr.strip().splitlines()]
        why = "; ".join(dict.fromkeys(lines[:3] + lines[-1:]))[:600]  # what failed, where, and why
        hint = ""
        said = "; ".join(p.hint for p in parts if p.hint and p.index_url)
        if index and not local_first and not first_use(stack) and said:
            hint = f" ({said}; where that is not reachable, --find-links DIR with its wheel)"
        raise ToolError(f"uv pip compile failed for stack {stack.model.name}: {why}{hint}")
    body = cp.stdout.replace("# via -r -", "# via (stack)").replace("#   -r -", "#   (stack)")
    header = (f"# The whole Python set of the {stack.model.name} image, for {PLATFORM} / Python {py}.\n"
              f"# Written by `toolbox lock --stack {stack.model.name}` (uv pip compile --generate-hashes);\n"
              "# the image installs it with pip --require-hashes. Do not edit: re-run toolbox lock / toolbox bump.\n"
              f"# inputs: {inputs_digest(stack)}\n"
              f"# torch inputs: {inputs_digest(stack, 'first')}\n")
    for r, note in _first_use_notes(stack).items():
        header += f"# first-use: {r} {note}\n"
    for name, why in left_out(stack).items():
        header += f"# left out: {name}, which PyPI Unsloth requires: {why}\n"
    out = user_lock_path(stack) if user else lock_path(stack)
    out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(out, statefiles.with_checksum(header + body))
    return out


def _run(cmd: list[str], text_in: str) -> subprocess.CompletedProcess:
    """subprocess.run, except that a SIGTERM arriving while the child starts still stops it: the signal is held
    until the Popen object exists (subprocess.run cannot kill a child whose Popen() raised; uv was left running)."""
    import signal

    old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    proc = None
    try:
        proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                preexec_fn=lambda: signal.pthread_sigmask(signal.SIG_SETMASK, old))  # uv's own mask
        signal.pthread_sigmask(signal.SIG_SETMASK, old)  # a held SIGTERM raises here, with `proc` to kill
        out, err = proc.communicate(text_in)
    except BaseException:
        if proc is not None:
            proc.kill()
            proc.wait()
        raise
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)
