"""Does a checkpoint belong to this config? Checked before `finetune --resume` touches anything.

Each checkpoint carries `toolbox_checkpoint.json` (the model, method and backend of the run that
wrote it); a checkpoint from before that file is judged by the output folder's
config.resolved.yaml. The trainable parameters' names and shapes are compared too: the
checkpoint's weight file header against the model this config builds, on the meta device (no
memory, no weights read)."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from toolbox_train.contract import UserError
from toolbox_train.disk import write_json
from toolbox_train.runs.folder import RESOLVED_CONFIG
from toolbox_train.models.weights import ADAPTER_WEIGHTS, WEIGHTS, WEIGHTS_INDEX

IDENTITY = "toolbox_checkpoint.json"


def identity(p) -> dict:
    """What must match for a checkpoint of this run to be resumed by another."""
    return {"model": p.model_path, "revision": p.cfg.model.revision, "method": p.cfg.method,
            "backend": p.backend}


def write_identity(folder: Path, p) -> None:
    write_json(folder / IDENTITY, identity(p))


def recorded(cp: Path, out: Path) -> dict | None:
    """The identity the checkpoint was written with (its own file, else the run's resolved config)."""
    try:
        own = json.loads((cp / IDENTITY).read_text())
        if isinstance(own, dict):
            return own
    except (OSError, ValueError):
        pass
    try:
        r = yaml.safe_load((out / RESOLVED_CONFIG).read_text())
        return {"model": r["model"]["path"], "revision": r["model"].get("revision"), "method": r["method"],
                "backend": (r.get("_resolved") or {}).get("backend")}
    except (OSError, ValueError, yaml.YAMLError, KeyError, TypeError, AttributeError):
        return None


def _weights_header(cp: Path) -> dict[str, list[int]] | None:
    """name -> shape of the checkpoint's weights (safetensors only; None for other formats)."""
    from safetensors import safe_open

    shards = [cp / n for n in (ADAPTER_WEIGHTS, WEIGHTS) if (cp / n).is_file()]
    index = cp / WEIGHTS_INDEX
    if not shards and index.is_file():
        shards = [cp / s for s in sorted(set(json.loads(index.read_text())["weight_map"].values()))]
    if not shards:
        return None
    out: dict[str, list[int]] = {}
    for f in shards:
        with safe_open(str(f), framework="pt") as st:
            for k in st.keys():
                out[k] = list(st.get_slice(k).get_shape())
    return out


def expected_weights(p) -> tuple[dict[str, list[int]], list[set[str]]]:
    """(name -> shape, groups of names of one tied tensor) of what this config's run saves:
    the PEFT adapter's state dict, or the whole model's parameters (method full)."""
    from toolbox_train.models.lora import adapter_shapes, meta_model

    if p.cfg.method != "full":
        shapes = adapter_shapes(p)
        return shapes, [{k} for k in shapes]
    model = meta_model(p)
    saved = _saved_names(model) if p.multimodal else {}
    groups: dict[int, set[str]] = {}
    for name, prm in model.named_parameters(remove_duplicate=False):
        groups.setdefault(id(prm), set()).add(saved.get(name, name))
    shapes = {saved.get(n, n): list(prm.shape) for n, prm in model.named_parameters(remove_duplicate=False)}
    return shapes, list(groups.values())


def _saved_names(model) -> dict[str, str]:
    """Parameter name -> its name in a saved checkpoint: transformers 5 saves a vision-language model under its
    checkpoints' names (Gemma 3: language_model.model..., the reverse of from_pretrained's renaming)."""
    from transformers.core_model_loading import revert_weight_conversion

    return {n: next(iter(revert_weight_conversion(model, {n: prm})), n)
            for n, prm in model.named_parameters(remove_duplicate=False)}


def _some(names, n=3) -> str:
    names = sorted(names)
    return ", ".join(names[:n]) + (f" and {len(names) - n} more" if len(names) > n else "")


def differences(cp: Path, p) -> list[str]:
    """What differs between checkpoint `cp` and this config; empty when it may be resumed."""
    diffs = []
    rec = recorded(cp, p.out)
    want = identity(p)
    if rec is not None:
        for key in ("model", "revision", "method", "backend"):
            if key in rec and rec[key] != want[key]:
                diffs.append(f"{key} {rec[key]!r} (this config: {want[key]!r})")
    if diffs or p.backend != "hf":  # Unsloth names its parameters its own way: identity only
        return diffs
    have = _weights_header(cp)
    if have is None:
        return diffs
    shapes, groups = expected_weights(p)
    missing = [sorted(g)[0] for g in groups if not g & have.keys()]
    extra = [n for n in have if n not in shapes]
    wrong = [f"{n} {have[n]} (this config: {shapes[n]})" for n in have if n in shapes and have[n] != shapes[n]]
    if missing:
        diffs.append(f"{len(missing)} trainable parameter(s) this config has are not in it ({_some(missing)})")
    if extra:
        diffs.append(f"{len(extra)} parameter(s) this config does not have ({_some(extra)})")
    if wrong:
        diffs.append(f"{len(wrong)} parameter shape(s) differ ({_some(wrong, 2)})")
    return diffs


def check(cp: Path, p) -> None:
    diffs = differences(cp, p)
    if diffs:
        raise UserError(f"--resume: {cp} is not a checkpoint of this config: {'; '.join(diffs)}; "
                        "resume with the config it was written with, or start over with --overwrite")
