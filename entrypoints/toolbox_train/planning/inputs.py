"""The run's inputs that need more than the file, checked before anything loads: the output folder
(and what a run that never reached step 1 left in it), the model folder, its config and weight files,
the installed TRL. Nothing heavy at import time (transformers inside the functions)."""

from __future__ import annotations

from pathlib import Path

from toolbox_train.config import tracking
from toolbox_train.contract import UserError
from toolbox_train.data.dataset import looks_like_hub_id, resolve_local
from toolbox_train.guards import cannot_make, unwritable
from toolbox_train.runs import checkpoints
from toolbox_train.runs.folder import RESOLVED_CONFIG
from toolbox_train.units import registry

# Files `launch` writes into the output folder before finetune starts.
LAUNCH_DIR = "launch"


def resolve_model(cfg, base: Path) -> str:
    local = resolve_local(cfg.model.path, base)
    if local is not None:
        if not (local / "config.json").is_file():
            raise UserError(f"model.path: {local}: no config.json (not a model folder)")
        return str(local)
    if not looks_like_hub_id(cfg.model.path):
        raise UserError(f"model.path: {cfg.model.path}: no such folder")
    return cfg.model.path


def config_has_vision(cfg, base: Path) -> bool:
    """Whether the model's config.json names a vision tower, read as JSON (a local folder, or the HF cache's copy of
    a hub id): what the backend is picked by, before transformers (or Unsloth) is imported. False where unknown."""
    import json

    local = resolve_local(cfg.model.path, base)
    path = local / "config.json" if local is not None else None
    if path is None and looks_like_hub_id(cfg.model.path):
        from huggingface_hub import try_to_load_from_cache

        found = try_to_load_from_cache(cfg.model.path, "config.json", revision=cfg.model.revision)
        path = Path(found) if isinstance(found, str) else None
    try:
        return path is not None and "vision_config" in json.loads(path.read_text())
    except (OSError, ValueError, TypeError):
        return False  # the config is read (and refused) with transformers later


def load_model_config(path: str, cfg):
    from transformers import AutoConfig

    try:
        return AutoConfig.from_pretrained(path, revision=cfg.model.revision,
                                          trust_remote_code=cfg.model.trust_remote_code)
    except Exception as exc:
        raise UserError(f"model.path: {path}: cannot read the model's config "
                        f"(not a local folder, and not in the HF cache while offline?): {exc}") from None


def text_config(mc):
    return mc.get_text_config() if hasattr(mc, "get_text_config") else mc


def is_multimodal(mc) -> bool:
    return getattr(mc, "vision_config", None) is not None


def gpu_available() -> bool:
    import torch

    return torch.cuda.is_available()


TRL_FOR_OBJECTIVES = "1.15.0"  # what the objectives are written against (objectives/<name>/trainer.py)


def trl_problem(cfg) -> None:
    """The preference objectives need TRL 1.15's trainers. Every shipped stack pins TRL 1.15.0 (the
    gfx1151 ones too since issue 24); an older TRL is an older image or a host venv of its own."""
    from importlib.metadata import PackageNotFoundError, version

    from packaging.version import Version

    try:
        have = version("trl")
    except PackageNotFoundError:
        have = None
    if have is None or Version(have) < Version(TRL_FOR_OBJECTIVES):
        raise UserError(f"objective: {cfg.objective} needs TRL >= {TRL_FOR_OBJECTIVES} (installed: {have or 'none'}); "
                        "every shipped stack pins TRL 1.15.0 (older gfx1151 images carry 0.24): rebuild the "
                        f"image or upgrade this environment's TRL, or use objective {registry.named(lambda u: not u.needs_trl)}")




# What a run writes before its first optimizer step (with `launch`'s folder): an output folder
# holding only these is treated as empty, so a run that failed before step 1 (OOM while loading,
# a crash in the first step) is rerun without --overwrite.


def pre_step_leftovers(out: Path) -> list[Path] | None:
    """What a run that never reached step 1 left in `out` (to clear before a fresh start), or
    None when `out` holds more than that (a step was taken, or the files are not ours)."""
    entries = [p for p in out.iterdir() if p.name != LAUNCH_DIR]
    if not entries:
        return []
    if not (out / RESOLVED_CONFIG).is_file():
        return None
    for p in entries:
        if p.name == RESOLVED_CONFIG or p.name in tracking.STORES:
            continue
        if p.name == "checkpoints" and p.is_dir() and not checkpoints.listed(p):
            continue
        return None
    return entries


def output_problem(out: Path, resume: bool, overwrite: bool) -> str | None:
    if not out.exists():  # made after every check: the nearest folder that exists must take it
        why = cannot_make(out)
        return f"output.dir: {out}: {why}" if why else None
    if not out.is_dir():
        return f"output.dir: {out}: exists and is not a folder"
    why = unwritable(out)
    if why:
        return f"output.dir: {out}: {why}"
    if not resume and not overwrite and pre_step_leftovers(out) is None:
        entries = [p.name for p in out.iterdir() if p.name != LAUNCH_DIR]
        return (f"output.dir: {out}: not empty ({', '.join(sorted(entries)[:5])}); "
                "pass --resume to continue or --overwrite to start over")
    return None


def model_files_problem(model_path: str, cfg) -> str | None:
    """A truncated or corrupt weight file of the model (a local folder or the HF cache's copy)."""
    from toolbox_train.models.weights import model_folder_problem

    folder = Path(model_path)
    if not folder.is_dir():
        try:
            from huggingface_hub import snapshot_download

            folder = Path(snapshot_download(model_path, revision=cfg.model.revision, local_files_only=True))
        except Exception:  # not cached whole: from_pretrained will say what it lacks
            return None
    why = model_folder_problem(folder)
    return f"model.path: {folder / why}" if why else None


