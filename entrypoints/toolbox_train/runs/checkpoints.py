"""Checkpoint folders: complete ones are `checkpoint-N`, written as `.partial-node<R>/checkpoint-N`
(R: the node's rank) and renamed when whole; resume takes the newest one in which every file
loads (trainer state, weights, optimizer, scheduler, RNG states)."""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
from pathlib import Path

from toolbox_train.guards import special_file
from toolbox_train.models.weights import ADAPTER_WEIGHTS, WEIGHTS, WEIGHTS_INDEX, safetensors_problem, torch_file_problem

PREFIX = "checkpoint-"
PARTIAL = ".partial"
WEIGHT_FILES = (WEIGHTS, ADAPTER_WEIGHTS, WEIGHTS_INDEX, "pytorch_model_fsdp_0", "pytorch_model.bin")


def _step(p: Path) -> int | None:
    m = re.fullmatch(rf"{PREFIX}(\d+)", p.name)
    return int(m.group(1)) if m else None


def listed(root: Path) -> list[Path]:
    if not root.is_dir():
        return []
    cps = [p for p in root.iterdir() if p.is_dir() and _step(p) is not None]
    return sorted(cps, key=lambda p: _step(p))


def problem(cp: Path) -> str | None:
    """Why `cp` cannot be resumed from (naming the file), or None when every file in it loads."""
    for f in cp.iterdir():
        kind = special_file(f)
        if kind:  # reading a FIFO would block for ever
            return f"{f.name} is {kind}, not a regular file"
    state = cp / "trainer_state.json"
    try:
        if not isinstance(json.loads(state.read_text()).get("global_step"), int):
            return "trainer_state.json has no global_step"
    except FileNotFoundError:
        return "no trainer_state.json"
    except (OSError, ValueError, AttributeError):  # JSON and UTF-8 errors are ValueErrors
        return "trainer_state.json is corrupt"
    weights = [cp / w for w in WEIGHT_FILES if (cp / w).exists()]
    if not weights:
        return "no model or adapter weights"
    if not (cp / "optimizer.pt").exists() and not any(cp.glob("optimizer*")):
        return "no optimizer state"
    for f in sorted(cp.glob("*.safetensors")):
        why = safetensors_problem(f)
        if why:
            return why
    # training_args.bin is a pickle that resuming never reads (and weights_only refuses).
    torch_files = sorted(cp.glob("*.pt")) + sorted(cp.glob("*.pth")) + [cp / "pytorch_model.bin"]
    for f in (f for f in torch_files if f.is_file()):
        why = torch_file_problem(f)
        if why:
            return why
    return None


def publish(staged: Path, final: Path) -> None:
    """Rename a finished checkpoint into place. Another node sharing the folder may have been
    first: then only the files it lacks (this node's RNG states) are moved in."""
    if final.exists() and problem(final) is not None:
        shutil.rmtree(final, ignore_errors=True)  # a stale, broken one of the same step
    if final.exists():
        for f in staged.iterdir():
            if not (final / f.name).exists():
                os.replace(f, final / f.name)
        shutil.rmtree(staged, ignore_errors=True)
        return
    try:
        os.replace(staged, final)
    except OSError:  # lost the race just now
        publish(staged, final)


def newest_complete(root: Path, warn=lambda m: print(m, file=sys.stderr)) -> Path | None:
    for partial in sorted(root.glob(f"{PARTIAL}*")) if root.is_dir() else []:
        if partial.is_dir() and any(partial.iterdir()):
            warn(f"finetune: warning: skipping incomplete checkpoint(s) in {partial}")
    for cp in reversed(listed(root)):
        why = problem(cp)
        if why is None:
            return cp
        warn(f"finetune: warning: skipping checkpoint {cp}: {why}")
    return None


def rotate(root: Path, keep: int) -> None:
    for cp in listed(root)[:-keep]:
        shutil.rmtree(cp, ignore_errors=True)
