"""The input of llama.cpp's `--mmproj` conversion: a vision model's tower and projector in the tensor layout
the pinned converter maps.

transformers 5.17 saves a Gemma 3 SigLIP tower as `vision_tower.embeddings...` (it drops SigLIP's
`vision_model.` level on load and does not put it back on save), while the converter maps only the
published layout `vision_tower.vision_model.embeddings...` ("Can not map tensor
'vision_tower.embeddings.patch_embedding.bias'", llama-cpp-python 0.3.36's tree). Where a folder holds
the short form, a staging folder gets the tower's tensors under the published names, beside links to the
folder's other files; the text GGUF is converted from the folder itself.
"""

from __future__ import annotations

import json
from pathlib import Path

from toolbox_train.models.families import every_family, vision_tower_kind


def vision_prefixes() -> tuple[str, ...]:
    """The tensors --mmproj reads: every family's tower and projector (the converters filter on these prefixes)."""
    tops = dict.fromkeys(p.split(".")[0] for p in every_family("tower_paths") + every_family("projector_paths"))
    return tuple(f"{m}{t}." for m in ("", "model.") for t in tops)


def _weights(folder: Path) -> list[Path]:
    idx = folder / "model.safetensors.index.json"
    if idx.is_file():
        return [folder / n for n in sorted(set(json.loads(idx.read_text())["weight_map"].values()))]
    return sorted(folder.glob("*.safetensors"))


def renaming(folder: Path) -> tuple[str, str] | None:
    """(saved, published) prefix where `folder` holds a tower in the short form; None where it is as published."""
    cfg = json.loads((folder / "config.json").read_text())
    kind = vision_tower_kind((cfg.get("vision_config") or {}).get("model_type"))  # (saved, published) prefixes
    rule = kind.published if kind else None
    if rule is None:
        return None
    from safetensors import safe_open

    saved, published = rule
    for f in _weights(folder):
        with safe_open(str(f), framework="pt") as st:
            keys = [k for k in st.keys() if k.startswith(saved)]
        if keys:
            return None if all(k.startswith(published) for k in keys) else rule
    return None


def source(folder: Path, staging: Path) -> Path:
    """The folder to run `--mmproj` on: `folder` itself, or `staging` made as the module docstring says."""
    rule = renaming(folder)
    if rule is None:
        return folder
    from safetensors import safe_open
    from safetensors.torch import save_file

    saved, published = rule
    staging.mkdir(parents=True)
    for f in folder.iterdir():
        if f.is_file() and not f.name.endswith((".safetensors", ".safetensors.index.json")):
            (staging / f.name).symlink_to(f.resolve())
    tensors, prefixes = {}, vision_prefixes()
    for f in _weights(folder):
        with safe_open(str(f), framework="pt") as st:
            for k in st.keys():
                if k.startswith(prefixes):
                    name = published + k[len(saved):] if k.startswith(saved) and not k.startswith(published) else k
                    tensors[name] = st.get_tensor(k)
    save_file(tensors, str(staging / "model.safetensors"), metadata={"format": "pt"})
    return staging
