"""In-container health probe: `python -m toolbox_train.commands.health [--lock FILE] [--json]`.

Reports the GPU torch sees and its arch, the HIP/CUDA version, which librccl/libnccl
torch loaded and its version, whether Unsloth imports, and the pins of the image's
lock file against what is installed. Exits 1 with a fix hint when something is off.
Stdlib only (torch and yaml are optional), so it runs in any image.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
from dataclasses import asdict, dataclass
from importlib import metadata
from pathlib import Path

from toolbox_train.export.llamacpp import DEFAULT_DIR
from toolbox_train.models.arithmetic import GiB

# What the image bakes (dockerfiles/runtime/entrypoints.j2 copies the stack's pin set here).
DEFAULT_LOCK = Path("/opt/toolbox/stack.lock.yaml")


@dataclass
class Check:
    name: str
    status: str  # ok | fail | info
    detail: str
    hint: str = ""


def _read_lock(path: Path) -> dict:
    text = path.read_text()
    try:
        import yaml

        data = yaml.safe_load(text)
    except ImportError:
        data = json.loads(text)
    if isinstance(data, dict) and isinstance(data.get("pins"), dict):
        return {**{k: v for k, v in data.items() if k != "pins"}, **data["pins"]}
    return data if isinstance(data, dict) else {}


# lock key -> distribution name, for pins of Python packages
def _dist_for(key: str) -> str | None:
    parts = key.split(".")
    if parts[0] == "llama_cpp":  # not pip packages (check_llama_cpp), but for the converter's sentencepiece
        return "sentencepiece" if parts[-1] == "sentencepiece" else None
    leaf = parts[-1]
    if leaf in ("commit", "repo", "index_url", "sha256", "url", "source", "extras", "digest", "image"):
        return None
    if leaf == "zoo_version":
        return "unsloth_zoo"
    if leaf == "version" and len(parts) >= 2:
        return parts[-2]
    if len(parts) >= 2 and parts[0] in ("hf", "torch", "python"):
        return leaf
    return None


def check_pins(lock: dict) -> list[Check]:
    out = []
    for key, want in sorted(lock.items()):
        dist = _dist_for(key)
        if not dist or not isinstance(want, str) or not re.match(r"^\d", want):
            continue
        try:
            have = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out.append(Check(f"pin {key}", "fail", f"{dist} {want} is pinned but not installed",
                             "rebuild the image: toolbox build --stack STACK"))
            continue
        same = have == want or ("+" not in want and have.split("+")[0] == want)
        out.append(Check(f"pin {key}", "ok" if same else "fail", f"{dist} {have} (pinned {want})",
                         "" if same else "the image drifted from its lock: rebuild it with toolbox build"))
    return out


def check_llama_cpp(lock: dict) -> list[Check]:
    """The llama.cpp tools export/evaluate run: present, of the locked commit, and runnable."""
    commit = lock.get("llama_cpp.commit")
    if not commit:
        return [Check("llama.cpp", "info", "not part of this stack")]
    root = Path(os.environ.get("LLAMA_CPP_DIR") or DEFAULT_DIR)
    hint = "rebuild the image: toolbox build --stack STACK"
    version = root / "VERSION"
    if not version.is_file():
        return [Check("llama.cpp", "fail", f"{root}: no llama.cpp tools (no VERSION file)", hint)]
    if commit not in version.read_text():
        return [Check("llama.cpp", "fail", f"{root} holds {version.read_text().strip()!r}, the lock pins {commit}", hint)]
    missing = [n for n in ("llama-quantize", "llama-perplexity", "llama-cli") if not os.access(root / "bin" / n, os.X_OK)]
    if missing or not (root / "convert_hf_to_gguf.py").is_file():
        return [Check("llama.cpp", "fail", f"{root}: missing {', '.join(missing) or 'convert_hf_to_gguf.py'}", hint)]
    try:
        cp = subprocess.run([str(root / "bin" / "llama-cli"), "--version"], capture_output=True, text=True, timeout=60)
        ok, out = cp.returncode == 0, (cp.stdout + cp.stderr).strip()
    except (OSError, subprocess.TimeoutExpired) as exc:
        ok, out = False, str(exc)
    if not ok:
        return [Check("llama.cpp", "fail", f"llama-cli --version failed: {out.splitlines()[-1] if out else '?'}", hint)]
    return [Check("llama.cpp", "ok", f"{root} at {commit[:12]} ({lock.get('llama_cpp.backend', '?')}): "
                  "llama-quantize, llama-perplexity, llama-cli, convert_hf_to_gguf.py")]


AOTRITON_ENV = "TORCH_ROCM_AOTRITON_ENABLE_EXPERIMENTAL"


def aotriton_check(arch: str, environ=os.environ) -> Check | None:
    """On gfx1151 torch's fast attention kernels (AOTriton flash / memory-efficient) are experimental
    and off unless AOTRITON_ENV=1: attention then falls back to the MATH kernel, which builds the
    whole score matrix - ROCm/legacy-rocm-build #6034 measured ~19x slower on Strix Halo, and
    unslothai/unsloth #8821 shows 'No available kernel' for both unless it is "1". The image's
    profile sets it; None for other archs."""
    if arch != "gfx1151":
        return None
    value = environ.get(AOTRITON_ENV)
    if value == "1":
        return Check("attention kernels", "ok", f"{AOTRITON_ENV}=1 (AOTriton flash/memory-efficient attention)")
    return Check("attention kernels", "fail",
                 f"{AOTRITON_ENV} is {'unset' if value is None else repr(value)}: attention falls back to the "
                 "slow MATH kernel on gfx1151 (ROCm/legacy-rocm-build #6034)",
                 f"export {AOTRITON_ENV}=1 (the image sets it, as ENV and in /etc/profile.d/toolbox-image.sh; "
                 "an environment that overrode or unset it lacks it)")


def loaded_collectives() -> list[str]:
    libs = set()
    try:
        for line in Path("/proc/self/maps").read_text().splitlines():
            path = line.split()[-1] if line.split() else ""
            base = os.path.basename(path)
            if base.startswith(("librccl", "libnccl")):
                libs.add(path)
    except OSError:
        pass
    return sorted(libs)


def probe(lock: dict, expect_platform: str | None, targets: list[str], check_unsloth: bool | None) -> list[Check]:
    checks: list[Check] = []
    platform = expect_platform or lock.get("platform") or None
    try:
        import torch
    except Exception as exc:  # noqa: BLE001 - any import failure is the finding
        checks.append(Check("torch", "fail", f"import torch failed: {exc}",
                            "a broken torch/RCCL pair ('undefined symbol: nccl...') means RCCL and torch "
                            "do not match: rebuild the image; run rccl-check"))
        return checks
    hip = getattr(torch.version, "hip", None)
    cuda = getattr(torch.version, "cuda", None)
    kind = "rocm" if hip else "cuda" if cuda else "cpu"
    checks.append(Check("torch", "ok", f"torch {torch.__version__} ({'HIP ' + hip if hip else 'CUDA ' + cuda if cuda else 'CPU build'})"))
    if platform and platform != kind:
        checks.append(Check("platform", "fail", f"expected a {platform} torch, found a {kind} build",
                            "the image's torch is not the stack's: rebuild it"))
    gpu = torch.cuda.is_available()
    if gpu:
        props = torch.cuda.get_device_properties(0)
        arch = getattr(props, "gcnArchName", "") or f"sm_{props.major}{props.minor}"
        arch_base = arch.split(":")[0]
        detail = f"{torch.cuda.device_count()} device(s); 0: {props.name}, arch {arch}, {props.total_memory / GiB:.1f} GiB"
        if targets and arch_base not in targets:
            checks.append(Check("gpu", "fail", detail + f"; the image is built for {', '.join(targets)}",
                                f"build a stack for {arch_base} (gpu_targets), or on gfx11 try HSA_OVERRIDE_GFX_VERSION"))
        else:
            checks.append(Check("gpu", "ok", detail))
        if hip:
            checks += [c for c in [aotriton_check(arch_base)] if c is not None]
    elif (platform or kind) in ("rocm", "cuda"):
        hint = ("start the container with /dev/kfd and /dev/dri, groups video and render and "
                "seccomp=unconfined (`toolbox run` adds them); check `ls -l /dev/kfd /dev/dri` on the host"
                if (platform or kind) == "rocm" else
                "start the container with the GPUs (`toolbox run` adds --gpus all / CDI nvidia.com/gpu=all)")
        checks.append(Check("gpu", "fail", "torch sees no GPU", hint))
    else:
        checks.append(Check("gpu", "info", "no GPU (CPU stack): training runs on the CPU (gloo for DDP)"))
    libs = loaded_collectives()
    version = None
    if gpu or kind != "cpu":
        try:
            v = torch.cuda.nccl.version()
            version = ".".join(map(str, v)) if isinstance(v, tuple) else str(v)
        except Exception:  # noqa: BLE001 - no NCCL/RCCL in this torch
            version = None
        libs = loaded_collectives() or libs
    if libs:
        checks.append(Check("collectives", "ok", f"loaded {', '.join(libs)}" + (f" (version {version})" if version else "")))
    elif kind == "cpu":
        checks.append(Check("collectives", "info", "no librccl/libnccl (CPU torch): DDP uses gloo"))
    else:
        checks.append(Check("collectives", "fail", f"torch loaded no {'librccl' if kind == 'rocm' else 'libnccl'}",
                            "run rccl-check; rebuild the image so torch and RCCL/NCCL match"))
    want_unsloth = check_unsloth if check_unsloth is not None else any(k.startswith("unsloth") for k in lock)
    if want_unsloth:
        cp = subprocess.run([sys.executable, "-c", "import unsloth; print(unsloth.__version__)"],
                            capture_output=True, text=True, timeout=300)
        if cp.returncode == 0:
            checks.append(Check("unsloth", "ok", f"unsloth {cp.stdout.strip().splitlines()[-1] if cp.stdout.strip() else ''} imports"))
        else:
            last = (cp.stderr.strip().splitlines() or ["?"])[-1]
            checks.append(Check("unsloth", "fail", f"import unsloth failed: {last}",
                                "Unsloth needs a visible GPU and its pinned unsloth_zoo; see the gpu check above"))
    else:
        checks.append(Check("unsloth", "info", "not part of this stack"))
    checks += check_llama_cpp(lock)
    checks += check_pins(lock)
    return checks


def render(checks: list[Check]) -> str:
    lines = []
    for c in checks:
        mark = {"ok": "ok  ", "fail": "FAIL", "info": "info"}[c.status]
        lines.append(f"[{mark}] {c.name}: {c.detail}")
        if c.status == "fail" and c.hint:
            lines.append(f"       fix: {c.hint}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="toolbox-doctor", description=__doc__.splitlines()[0])
    p.add_argument("--lock", type=Path, help="the stack lock to compare against (default: the image's)")
    p.add_argument("--expect-platform", choices=["rocm", "cuda", "cpu"])
    p.add_argument("--gpu-target", action="append", default=[], help="an arch the image is built for")
    p.add_argument("--unsloth", dest="unsloth", action="store_true", default=None, help="require Unsloth")
    p.add_argument("--no-unsloth", dest="unsloth", action="store_false")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    lock: dict = {}
    lock_path = args.lock or (DEFAULT_LOCK if DEFAULT_LOCK.exists() else None)
    if args.lock and not args.lock.is_file():
        print(f"toolbox-doctor: --lock {args.lock}: no such file", file=sys.stderr)
        return 2
    if lock_path:
        lock = _read_lock(lock_path)
    checks = probe(lock, args.expect_platform, args.gpu_target, args.unsloth)
    if lock_path is None:
        checks.append(Check("lock", "info", "no stack lock in this image; pins not compared"))
    failed = [c for c in checks if c.status == "fail"]
    if args.json:
        print(json.dumps({"ok": not failed, "checks": [asdict(c) for c in checks]}, indent=1))
    else:
        print(render(checks))
        print("doctor: all good" if not failed else f"doctor: {len(failed)} problem(s)")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
