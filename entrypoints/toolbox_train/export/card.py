"""The model card (README.md, the Hub's format) written beside every model a run gives: the run folder
(its adapter or full model, at the end of finetune) and each `export-model` output (merged, GGUF).

Everything in it is read from the run: config.resolved.yaml (base, data, objective, method, LoRA and
training settings), summary.json (the final metrics), and the base model's own card or config for
its license. huggingface_hub's ModelCard/ModelCardData write the YAML front matter the Hub reads.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from toolbox_train.disk import atomic_write
from toolbox_train.runs.folder import SUMMARY
from toolbox_train.units import registry

CARD = "README.md"
# A Hub cache snapshot: .../models--ORG--NAME/snapshots/REV (its repo id is in the path).
_CACHE_SNAPSHOT = re.compile(r"models--([^/]+?)--([^/]+)/snapshots/[^/]+/?$")


def _hub_id(path: str) -> str | None:
    from toolbox_train.data.dataset import looks_like_hub_id

    if not Path(path).exists() and looks_like_hub_id(path):
        return path
    m = _CACHE_SNAPSHOT.search(str(Path(path).resolve()) if Path(path).exists() else path)
    return f"{m.group(1)}/{m.group(2)}" if m else None


def _base_file(base: str, name: str, revision: str | None) -> Path | None:
    """A file of the base model: in its folder, or in the Hub cache for a hub id (never downloaded)."""
    if Path(base, name).is_file():
        return Path(base, name)
    hub = _hub_id(base)
    if hub:
        from huggingface_hub import try_to_load_from_cache

        hit = try_to_load_from_cache(hub, name, revision=revision)
        if isinstance(hit, str):
            return Path(hit)
    return None


def base_license(base: str, revision: str | None = None) -> dict[str, str]:
    """license (and license_name/license_link for `other`) as the base's card or config names it."""
    from huggingface_hub import ModelCard

    found: dict[str, str] = {}
    card = _base_file(base, CARD, revision)
    if card is not None:
        try:
            data = ModelCard.load(card, ignore_metadata_errors=True).data
            found = {k: getattr(data, k) for k in ("license", "license_name", "license_link") if getattr(data, k, None)}
        except Exception:  # a README without front matter, or not UTF-8: no license from it
            found = {}
    if "license" not in found:
        cfg = _base_file(base, "config.json", revision)
        try:
            lic = json.loads(cfg.read_text()).get("license") if cfg else None
        except (OSError, ValueError):
            lic = None
        if isinstance(lic, str) and lic:
            found = {"license": lic}
    return {k: str(v) for k, v in found.items()}


def _sources(data: Any, key: str = "") -> list[str]:
    """Every data file or dataset the config names (data.path, data.eval_path, and those of any list
    of sources under data), in order."""
    if isinstance(data, dict):
        return [s for k, v in data.items() for s in _sources(v, k)]
    if isinstance(data, list):
        return [s for v in data for s in _sources(v, key)]
    return [data] if isinstance(data, str) and key.endswith("path") else []


def _shown(source: str) -> str:
    # A local path is shown by its name alone: the card is written to be published.
    return source if _hub_id(source) else f"{Path(source).name} (local file)"


def _fmt(v: Any) -> str:
    return f"{v:.4g}" if isinstance(v, float) else str(v)


def card_text(resolved: dict, summary: dict, output: str, files: list[str] = ()) -> str:
    """The card of one output: `adapter` or `full` (the run folder), `merged`, or `gguf`."""
    from huggingface_hub import ModelCard, ModelCardData

    model, data, train, lora = resolved["model"], resolved.get("data") or {}, resolved.get("train") or {}, \
        resolved.get("lora") or {}
    r = resolved.get("_resolved") or {}
    method, objective = resolved["method"], resolved.get("objective", registry.DEFAULT)
    base = model["path"]
    hub_base = _hub_id(base)
    sources = list(dict.fromkeys(_sources(data)))
    datasets = [s for s in sources if _hub_id(s) and not Path(s).exists()]
    library = {"adapter": "peft", "full": "transformers", "merged": "transformers"}.get(output)
    vision = r.get("data_format") == "vision"  # image rows: a vision-language model (training.md)
    tags = ["toolbox", "trl", objective, method] + (["gguf"] if output == "gguf" else []) + (["vision"] if vision else [])
    meta = ModelCardData(
        base_model=hub_base, datasets=datasets or None, library_name=library, tags=tags,
        pipeline_tag="image-text-to-text" if vision else "text-generation", **base_license(base, model.get("revision")),
        **({"base_model_relation": "adapter" if output == "adapter" else "finetune"} if hub_base else {}))

    lora_used = method != "full"
    what = {"full": "full fine-tune", "lora": "LoRA fine-tune", "qlora": "QLoRA fine-tune (4-bit base)",
            "lora-8bit": "LoRA fine-tune (8-bit base)"}.get(method, method)
    shape = {"adapter": "the LoRA adapter (load it on the base with PEFT)", "full": "the full model (safetensors)",
             "merged": "the adapter merged into the base, 16-bit safetensors",
             "gguf": "GGUF files for llama.cpp / Ollama / LM Studio: " + ", ".join(files)}[output]
    out_cfg = resolved.get("output") or {}
    lines = [f"# {out_cfg.get('run_name') or Path(out_cfg.get('dir') or 'model').name}", "",
             f"A {what} of {f'[{hub_base}](https://huggingface.co/{hub_base})' if hub_base else f'`{Path(base).name}`'}"
             f" with the `{objective}` objective, trained by toolbox's `finetune`. This folder holds {shape}.", "",
             "## Training data", ""]
    lines += [f"- {_shown(s)}" for s in sources] or ["- (not recorded)"]
    if r.get("data_format") or data.get("format"):
        lines += ["", f"Format: {r.get('data_format') or data.get('format')}; at most "
                  f"{data.get('max_seq_length')} tokens a sequence{', packed' if data.get('packing') else ''}."]
    if vision:
        lines += ["", "A vision-language model, trained on images and text (load it with AutoModelForImageTextToText "
                  f"and its processor); the parts trained: {', '.join((resolved.get('vision') or {}).get('train', []))}."]
    lines += ["", "## Method", "", f"- method: {method}"]
    if lora_used:
        targets = lora.get("target_modules")
        lines += [f"- LoRA: r {lora.get('r')}, alpha {lora.get('alpha')}, dropout {lora.get('dropout')}, target "
                  f"modules {', '.join(targets) if isinstance(targets, list) else targets}"]
    world, accum = r.get("world_size", 1), r.get("gradient_accumulation_steps", train.get("gradient_accumulation_steps"))
    per_dev = r.get("per_device_batch_size", train.get("per_device_batch_size"))  # `auto`: the resolved batch
    hp = [("learning rate", train.get("learning_rate")), ("scheduler", train.get("lr_scheduler")),
          ("warmup", train.get("warmup_ratio") or train.get("warmup_steps")),
          *([("max steps", train["max_steps"])] if (train.get("max_steps") or -1) > 0 else [("epochs", train.get("epochs"))]),
          ("batch per device", per_dev), ("gradient accumulation", accum), ("devices", world),
          ("global batch", per_dev * accum * world if all(isinstance(x, int) for x in (per_dev, accum, world)) else None),
          ("optimizer", train.get("optimizer")), ("weight decay", train.get("weight_decay")),
          ("max grad norm", train.get("max_grad_norm")), ("precision", r.get("precision") or train.get("precision")),
          ("seed", train.get("seed"))]
    lines += ["", "## Hyperparameters", "", "| setting | value |", "| --- | --- |"]
    lines += [f"| {k} | {_fmt(v)} |" for k, v in hp if v is not None]
    results = [("steps", summary.get("steps")), ("first loss", summary.get("first_loss")),
               ("final loss", summary.get("last_loss")), ("eval loss", summary.get("eval_loss")),
               ("tokens trained", summary.get("tokens"))]
    for k, v in (summary.get("objective") or {}).items():  # e.g. DPO's rewards/accuracies: {first, last}
        if isinstance(v, dict) and "last" in v:
            results.append((f"final {k}", v["last"]))
    lines += ["", "## Results", "", "| metric | value |", "| --- | --- |"]
    lines += [f"| {k} | {_fmt(v)} |" for k, v in results if v is not None]
    if meta.license:
        lines += ["", "## License", "", f"The base model's license: {meta.license}"
                  + (f" ({meta.license_name})" if getattr(meta, "license_name", None) else "") + "."]
    return str(ModelCard(f"---\n{meta.to_yaml()}\n---\n\n" + "\n".join(lines) + "\n"))


def write(run: Path, resolved: dict, dest: Path, output: str, files: list[str] = ()) -> Path:
    """README.md in `dest` for the run in `run` (its summary.json read there)."""
    summary = json.loads((run / SUMMARY).read_text()) if (run / SUMMARY).is_file() else {}
    path = dest / CARD
    atomic_write(path, card_text(resolved, summary, output, files))
    return path


def write_run_cards(out: Path, method: str, save: str) -> list[Path]:
    """The cards of what finetune left in `out`: its adapter or full model, and `merged/` with
    output.save: both."""
    import yaml

    from toolbox_train.runs.folder import RESOLVED_CONFIG

    resolved = yaml.safe_load((out / RESOLVED_CONFIG).read_text())
    kind = "full" if method == "full" else ("merged" if save == "merged" else "adapter")
    written = [write(out, resolved, out, kind)]
    if method != "full" and save == "both" and (out / "merged").is_dir():
        written.append(write(out, resolved, out / "merged", "merged"))
    return written
