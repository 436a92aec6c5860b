"""Cheap integrity checks of weight and state files, so a truncated or corrupt file is named
before anything is loaded or written (a model folder) or before a checkpoint is resumed from."""

from __future__ import annotations

import json
import struct
from pathlib import Path

from toolbox_train.contract import first_line

# The file names transformers and PEFT save under (SAFE_WEIGHTS_NAME, SAFE_WEIGHTS_INDEX_NAME; PEFT's
# SAFETENSORS_WEIGHTS_NAME), named here so that the checks import neither library.
WEIGHTS = "model.safetensors"
WEIGHTS_INDEX = "model.safetensors.index.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"

# safetensors' own limit on the JSON header (100 MB); a larger length is garbage.
MAX_HEADER = 100_000_000


def safetensors_problem(path: Path) -> str | None:
    """Why `path` is not a whole safetensors file (header parses, every tensor's bytes present)."""
    try:
        size = path.stat().st_size
        with path.open("rb") as f:
            head = f.read(8)
            if len(head) < 8:
                return f"{path.name}: truncated or corrupt ({size} bytes, no safetensors header)"
            (n,) = struct.unpack("<Q", head)
            if n > MAX_HEADER or 8 + n > size:
                return f"{path.name}: truncated or corrupt (safetensors header of {n} bytes, file of {size})"
            header = json.loads(f.read(n))
    except OSError as exc:
        return f"{path.name}: cannot be read ({exc.strerror or exc})"
    except (UnicodeDecodeError, json.JSONDecodeError):
        return f"{path.name}: corrupt safetensors header"
    if not isinstance(header, dict):
        return f"{path.name}: corrupt safetensors header"
    end = 0
    for name, t in header.items():
        if name == "__metadata__":
            continue
        offs = t.get("data_offsets") if isinstance(t, dict) else None
        if not (isinstance(offs, list) and len(offs) == 2 and all(isinstance(o, int) for o in offs)):
            return f"{path.name}: corrupt safetensors header (tensor {name!r})"
        end = max(end, offs[1])
    if 8 + n + end > size:
        return f"{path.name}: truncated or corrupt (its tensors need {8 + n + end} bytes, the file has {size})"
    return None


def torch_file_problem(path: Path) -> str | None:
    """Why torch cannot load `path` (optimizer.pt, scheduler.pt, rng_state*.pth, *.bin).

    Loaded the way transformers resumes them (weights_only), memory-mapped so a large optimizer
    state is not read into memory.
    """
    import torch
    from transformers.trainer_pt_utils import safe_globals  # the numpy types RNG states hold

    try:
        with safe_globals():
            torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception as exc:  # torch raises RuntimeError, pickle errors, EOFError, zip errors...
        first = first_line(exc)
        return f"{path.name}: truncated or corrupt, cannot be loaded ({first[:200]})"
    return None


def model_folder_problem(folder: Path) -> str | None:
    """The first weight file of a model folder that is missing, truncated or corrupt."""
    index = folder / WEIGHTS_INDEX
    files = sorted(folder.glob("*.safetensors"))
    if index.is_file():
        try:
            shards = set(json.loads(index.read_text())["weight_map"].values())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError, AttributeError):
            return f"{index.name}: corrupt index"
        missing = sorted(s for s in shards if not (folder / s).is_file())
        if missing:
            return f"{index.name}: lists {missing[0]}, which is missing"
    for f in files:
        why = safetensors_problem(f)
        if why:
            return why
    return None
