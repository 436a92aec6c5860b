"""What a finished finetune output folder holds: a full model or an adapter plus its base."""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass
from pathlib import Path

import yaml

from toolbox_train.contract import UserError, first_line
from toolbox_train.guards import check_path, special_file
from toolbox_train.models.families import family
from toolbox_train.models.weights import ADAPTER_WEIGHTS, WEIGHTS, WEIGHTS_INDEX, model_folder_problem, safetensors_problem

# What every finished (or resumable) output folder holds beside the weights: finetune writes it.
RESOLVED_CONFIG = "config.resolved.yaml"
METRICS = "metrics.jsonl"  # one JSON line per logged optimizer step (trainer.Metrics)
SUMMARY = "summary.json"  # the end of the run (finetune.summarize): a finished run has one


def _safetensors(folder: Path) -> list[Path]:
    idx = folder / WEIGHTS_INDEX
    if idx.is_file():
        try:
            names = sorted(set(json_object(idx)["weight_map"].values()))
        except (KeyError, TypeError, AttributeError):
            raise UserError(f"{idx}: corrupt index (no weight_map of file names)") from None
        return [folder / n for n in names]
    return [folder / WEIGHTS] if (folder / WEIGHTS).is_file() else []


def _count(files: list[Path], skip=lambda k: False) -> int:
    from safetensors import safe_open

    n = 0
    for f in files:
        with safe_open(str(f), framework="pt") as st:
            for k in st.keys():
                if not skip(k):
                    shape = st.get_slice(k).get_shape()
                    p = 1
                    for d in shape:
                        p *= d
                    n += p
    return n


@dataclass
class RunModel:
    run: Path
    kind: str            # "full" (weights in the run folder) or "adapter" (LoRA/QLoRA on `base`)
    method: str
    base: str | None
    model_type: str
    multimodal: bool
    resolved: dict

    def weights_folder(self) -> Path:
        return self.run if self.kind == "full" else Path(self.base)

    def param_count(self) -> int:
        return _count(_safetensors(self.weights_folder()))

    def default_dtype(self) -> str:
        cfg = json.loads((self.weights_folder() / "config.json").read_text())
        d = str(cfg.get("dtype") or cfg.get("torch_dtype") or "")
        return {"float16": "fp16", "bfloat16": "bf16"}.get(d, "bf16")

    def describe(self) -> str:
        if self.kind == "full":
            return f"{self.run} ({self.model_type}, {self.method} fine-tune)"
        return f"{self.run} ({self.model_type}, {self.method} adapter on {self.base})"

    @property
    def vision(self) -> bool:
        """Trained on image rows (finetune's resolved data format): an image-text model with a processor."""
        return (self.resolved.get("_resolved") or {}).get("data_format") == "vision"

    def architecture(self) -> str:
        cfg = json_object(self.weights_folder() / "config.json")
        archs = cfg.get("architectures") or ["?"]
        return str(archs[0])

    def export_notes(self, to: str) -> list[str]:
        notes = []
        if self.method == "qlora":
            notes.append("QLoRA: the adapter is merged into the base's 16-bit weights (loaded unquantized), "
                         "never into 4-bit weights")
        if self.vision:
            notes.append("vision-language run: the merged model is an image-text model (AutoModelForImageTextToText) "
                         "saved with its processor")
        elif self.multimodal:
            notes.append("multimodal checkpoint trained on text: the merged export holds the whole model (vision "
                         "tower and projector unchanged by text fine-tuning)")
        fam = family(self.model_type)  # GPT-OSS: its experts de-quantized, and re-quantized for llama.cpp
        if fam.export_note:
            notes.append(f"{fam.name}: {fam.export_note}" + (f"; {fam.gguf_note}" if to == "gguf" and fam.gguf_note
                                                             else ""))
        return notes

    def eval_texts(self, tokenizer) -> list[str]:
        """The run's held-out rows as plain text (eval_path, or the eval_split finetune held out)."""
        from toolbox_train.data.dataset import load_datasets

        cfg = resolved_config(self.run, self.resolved)
        if not cfg.data.has_eval():
            raise UserError(f"--run {self.run}: the run had no eval split (data.eval_path / data.eval_split); "
                            "pass --data FILE")
        _, evald, _ = load_datasets(cfg, Path(self.resolved.get("_base", "/")))
        return rows_to_texts(evald, tokenizer)


def rows_to_texts(ds, tokenizer) -> list[str]:
    """Eval rows as text: SFT's, or the preferred continuation of preference rows (chosen; an
    unpaired row only when labelled desirable)."""
    out = []
    for row in ds:
        if "text" in row:
            out.append(str(row["text"]))
        elif "messages" in row:
            out.append(tokenizer.apply_chat_template(row["messages"], tokenize=False))
        elif "chosen" in row or "completion" in row:
            if row.get("label") is False:
                continue
            done = row["chosen"] if "chosen" in row else row["completion"]
            prompt = row.get("prompt") or ([] if isinstance(done, list) else "")
            out.append(tokenizer.apply_chat_template(prompt + done, tokenize=False) if isinstance(done, list)
                       else f"{prompt}{done}")
        elif "prompt" in row:  # GRPO's prompt-only rows
            p = row["prompt"]
            out.append(tokenizer.apply_chat_template(p, tokenize=False) if isinstance(p, list) else str(p))
    return out


def _readable(f: Path) -> Path:
    kind = special_file(f)
    if kind:  # a FIFO would block the read for ever
        raise UserError(f"{f}: {kind}, not a regular file (it is not read)")
    return f


def json_object(f: Path) -> dict:
    """A JSON file of the run or its base that must hold an object: a damaged one is named."""
    try:
        obj = json.loads(_readable(f).read_text())
    except (OSError, ValueError) as exc:  # JSON and UTF-8 errors are ValueErrors
        raise UserError(f"{f}: truncated or corrupt ({first_line(exc, 120)})") from None
    if not isinstance(obj, dict):
        raise UserError(f"{f}: corrupt (a JSON {type(obj).__name__}, not an object)")
    return obj


def _check_files(run: Path, kind: str, base: str | None) -> None:
    """Every file export/evaluate will load, checked before anything is loaded or written."""
    for folder in (run, Path(base)) if kind == "adapter" else (run,):
        for f in folder.iterdir():  # tokenizer.model, vocab.json...: a FIFO among them would block a loader
            _readable(f)
    for name in (SUMMARY, "tokenizer_config.json", "tokenizer.json", "generation_config.json",
                 "special_tokens_map.json"):
        if (run / name).exists():
            json_object(run / name)
    if kind == "adapter":
        json_object(run / "adapter_config.json")
        why = safetensors_problem(_readable(run / ADAPTER_WEIGHTS))
        folder = Path(base)
    else:
        why, folder = None, run
    json_object(folder / "config.json")
    for f in folder.glob("*.safetensors*"):
        _readable(f)
    why = why or model_folder_problem(folder)
    if why:
        raise UserError(f"{run if kind == 'full' or why.startswith('adapter_') else folder}/{why}")


@contextlib.contextmanager
def loading(what: str):
    """Loading a checked run or model that a library still cannot read: bad input, one line."""
    try:
        yield
    except (UserError, MemoryError):
        raise
    except Exception as exc:  # noqa: BLE001 (transformers/peft/tokenizers raise anything)
        raise UserError(f"{what} cannot be loaded: {type(exc).__name__}: {first_line(exc, 200)}") from None


def scoring_device() -> tuple[str, object]:
    """(device, dtype) a model is scored in: the GPU in bf16 where there is one (a 27B model in fp32 would need
    ~108 GB, more than a Strix Halo gives its GPU), else the CPU in fp32."""
    import torch

    if torch.cuda.is_available() and torch.cuda.is_bf16_supported():
        return "cuda", torch.bfloat16
    return "cpu", torch.float32


def hf_model(path: str, adapter: Path | None = None, image_text: bool = False):
    """The model at `path` for scoring (scoring_device: bf16 on the GPU, fp32 on the CPU; an image-text model
    with `image_text`), with `adapter` on it."""
    import transformers

    auto = transformers.AutoModelForImageTextToText if image_text else transformers.AutoModelForCausalLM
    device, dtype = scoring_device()
    with loading(f"{path}: the model"):
        model = auto.from_pretrained(path, dtype=dtype, **({"device_map": {"": 0}} if device == "cuda" else {}))
    if adapter is not None:
        from peft import PeftModel

        with loading(f"--run {adapter}: the adapter"):
            model = PeftModel.from_pretrained(model, str(adapter))
    return model.eval()


def resolved_config(run: Path, resolved: dict):
    """The run's config.resolved.yaml as a TrainConfig; a truncated or edited one is named."""
    from pydantic import ValidationError

    from toolbox_train.config.schema import TrainConfig

    try:
        return TrainConfig.model_validate({k: v for k, v in resolved.items() if not k.startswith("_")})
    except ValidationError as exc:
        e = exc.errors()[0]
        where = ".".join(str(x) for x in e["loc"])
        raise UserError(f"{run / 'config.resolved.yaml'}: {where}: {e['msg']} (truncated or edited?)") from None


def find_finished(run: Path) -> RunModel:
    run = check_path(str(run), "--run").expanduser().resolve()
    if not run.is_dir():
        raise UserError(f"--run {run}: no such folder")
    resolved_f = run / RESOLVED_CONFIG
    if not (run / SUMMARY).is_file() or not resolved_f.is_file():
        raise UserError(f"--run {run}: no finished model (no summary.json/config.resolved.yaml: the run did not "
                        "finish, or this is not a finetune output folder)")
    try:
        resolved = yaml.safe_load(_readable(resolved_f).read_text()) or {}
        method = resolved["method"]
        base = resolved["model"]["path"]
        if not (isinstance(method, str) and isinstance(base, str)):
            raise TypeError("method and model.path must be text")
    except (yaml.YAMLError, ValueError, KeyError, TypeError) as exc:  # UTF-8 errors are ValueErrors
        raise UserError(f"{resolved_f}: unreadable ({first_line(exc, 120)})") from None
    resolved_config(run, resolved)
    resolved["_base"] = str(run)
    if (run / "adapter_config.json").is_file() and (run / ADAPTER_WEIGHTS).is_file():
        kind = "adapter"
        if not (Path(base) / "config.json").is_file():
            raise UserError(f"{resolved_f}: model.path: {base}: the base model is not a local folder here "
                            "(the adapter needs it to be merged)")
        cfg_dir = Path(base)
    elif _safetensors(run) and (run / "config.json").is_file():
        kind, cfg_dir = "full", run
    else:
        raise UserError(f"--run {run}: no finished model (no adapter_model.safetensors or model.safetensors)")
    if not (run / "tokenizer_config.json").is_file():
        raise UserError(f"--run {run}: no tokenizer saved in the run folder")
    _check_files(run, kind, base)
    cfg = json_object(cfg_dir / "config.json")
    return RunModel(run, kind, method, base if kind == "adapter" else None, cfg.get("model_type", "?"),
                    cfg.get("vision_config") is not None, resolved)
