"""The train.yaml schema (pydantic v2): unknown keys are refused with their field path."""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Annotated, Any, Callable, Literal, Sequence

from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model, field_validator, model_validator

from toolbox_train.contract import UserError
from toolbox_train.guards import path_problem, special_file
from toolbox_train.safe_yaml import SafeYamlError, load_file, load_text
from toolbox_train.config.errors import fmt_errors, set_item
from toolbox_train.units import registry
from toolbox_train.config.tracking import MlflowCfg, Tracker, TrackioCfg, WandbCfg


class _Strict(BaseModel):
    # allow_inf_nan: an infinite learning rate or epoch count parses, and trains NaN or for ever.
    # frozen: the parsed config stays as written; what is resolved from it is the run's (planning/run.py)
    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False, frozen=True)


def _openable(v: Any) -> Any:
    """A path field: refused here (at its line) when no OS call could take it."""
    why = path_problem(v) if isinstance(v, str) else None
    if why:
        raise ValueError(why)
    return v


class ModelCfg(_Strict):
    path: str = Field(description="local directory or hub id")
    revision: str | None = None
    trust_remote_code: bool = False
    attn_implementation: str | None = Field(None, description="sdpa, eager, flash_attention_2 ...")

    _path = field_validator("path")(_openable)


FORMATS = Literal["auto", "text", "alpaca", "messages", "preference", "unpaired", "prompt"]
# The keys a source of a mixture owns; with data.sources they are written per source, not under data.
SOURCE_KEYS = ("format", "split", "text_field", "fields", "eval_path", "eval_split")
# The formats' field names a file's own column names may be mapped to (text's is data.text_field).
FIELD_NAMES = ("instruction", "input", "output", "messages", "prompt", "chosen", "rejected", "completion", "label")


def _fields(v: dict[str, str]) -> dict[str, str]:
    for key, col in v.items():
        if key not in FIELD_NAMES:
            hint = "; text's column is text_field" if key == "text" else ""
            raise ValueError(f"{key!r} is not a field of a data format ({', '.join(FIELD_NAMES)}){hint}")
        if not col:
            raise ValueError(f"{key}: an empty column name")
    dup = {c for c in v.values() if list(v.values()).count(c) > 1}
    if dup:
        raise ValueError(f"column {sorted(dup)[0]!r} is named for two fields")
    return v


FIELDS_DOC = "the file's column for a format's field, e.g. {instruction: question, output: answer}"


class SourceCfg(_Strict):
    """One source of a mixture (data.sources): its own file, format, field names and eval split."""
    path: str = Field(description="JSONL/Parquet/CSV file, a saved `datasets` folder, or a hub id")
    format: FORMATS = "auto"
    split: str = "train"
    text_field: str = "text"
    fields: dict[str, str] = Field(default_factory=dict, description=FIELDS_DOC)
    weight: float | None = Field(None, gt=0, description="the source's share of the mixture's rows, relative to "
                                 "the other sources' weights; on every source or on none (none: every row once)")
    eval_path: str | None = None
    eval_split: float = Field(0.0, ge=0.0, lt=1.0, description="fraction of this source held out for eval")

    _paths = field_validator("path", "eval_path")(_openable)
    _columns = field_validator("fields")(_fields)


class DataCfg(_Strict):
    path: str | None = Field(None, description="JSONL/Parquet/CSV file, a saved `datasets` folder, or a hub id")
    sources: list[SourceCfg] | None = Field(None, min_length=1, description="several sources mixed into one "
                                            "training set, instead of data.path")
    format: FORMATS = Field(
        "auto", description="auto: the objective's own (docs/preference.md), detected for text rows; or name it")
    split: str = "train"
    text_field: str = "text"
    fields: dict[str, str] = Field(default_factory=dict, description=FIELDS_DOC)
    eval_path: str | None = None
    eval_split: float = Field(0.0, ge=0.0, lt=1.0, description="fraction held out for eval when eval_path is unset")
    stopping_strategy: Literal["first_exhausted", "all_exhausted"] = Field(
        "first_exhausted", description="weighted sources (datasets.interleave_datasets): first_exhausted: the "
        "mixture ends when a source runs out (no row twice); all_exhausted: smaller sources repeat until every "
        "source has been seen whole")
    train_on: Literal["responses", "all"] = Field(
        "responses", description="the next-token loss: responses: the assistant turns of chat rows (TRL's "
        "assistant_only_loss), the completion of prompt/completion rows (completion_only_loss); all: every token")
    max_seq_length: int = Field(1024, gt=0)
    packing: bool = False
    shuffle: bool = True
    loader_workers: Annotated[int, Field(ge=0)] | Literal["auto"] = Field(
        "auto", description="data loader processes that read and collate the next batches while the "
        "device trains; auto: 1 with a GPU, 0 (in the training process) on a CPU and on gfx1151 (unified memory)")

    _paths = field_validator("path", "eval_path")(_openable)
    _columns = field_validator("fields")(_fields)

    def each_source(self) -> list:
        """The sources (data.sources), or this section itself as the one source (data.path)."""
        return list(self.sources) if self.sources else [self]

    def has_eval(self) -> bool:
        return any(s.eval_path or s.eval_split > 0 for s in self.each_source())

    def paths(self) -> list[str]:
        """Every data file or folder the run reads (train and eval, of every source)."""
        return [x for s in self.each_source() for x in (s.path, s.eval_path) if x]

    def problem(self) -> str | None:
        """What the field checks cannot see: path or sources, and the weights on all sources or none."""
        if self.sources is None:
            return None if self.path else "data.path: required (or data.sources, a list of sources)"
        if self.path:
            return "data.sources: give data.path or data.sources, not both"
        for key in SOURCE_KEYS:
            if key in self.model_fields_set:
                return f"data.{key}: with data.sources it is set per source (data.sources.N.{key})"
        weighted = [s.weight is not None for s in self.sources]
        if any(weighted) and not all(weighted):
            i = weighted.index(False)
            return f"data.sources.{i}.weight: required when another source has a weight (on every source or none)"
        return None


class LoraCfg(_Strict):
    r: int = Field(16, gt=0)
    alpha: int = Field(32, gt=0)
    dropout: float = Field(0.0, ge=0.0, lt=1.0)
    target_modules: list[str] | Literal["all-linear"] = "all-linear"


class TrainCfg(_Strict):
    epochs: float = Field(1.0, gt=0)
    max_steps: int = Field(-1, description="-1: run `epochs` epochs")
    per_device_batch_size: Annotated[int, Field(gt=0)] | Literal["auto"] = Field(
        1, description="auto: the memory planner picks the fastest batch that fits the device (with "
        "train.gradient_checkpointing: auto, checkpointing too)")
    batch_size: int | None = Field(
        None, gt=0, description="global batch (all ranks); sets gradient_accumulation_steps"
    )
    gradient_accumulation_steps: int = Field(1, gt=0)
    learning_rate: float = Field(2e-4, gt=0)
    lr_scheduler: str = "cosine"
    warmup_steps: int = Field(0, ge=0)
    warmup_ratio: float = Field(0.0, ge=0.0, lt=1.0)
    weight_decay: float = Field(0.0, ge=0.0)
    optimizer: str = Field("adamw_torch_fused", description="a transformers optim name; the fused AdamW "
                           "(transformers' own default) steps every tensor in one kernel launch")
    max_grad_norm: float = Field(1.0, ge=0.0)
    precision: Literal["auto", "fp32", "bf16", "fp16"] = "auto"
    seed: int = 42
    gradient_checkpointing: bool | Literal["unsloth", "auto"] = Field(
        "auto", description="auto: off where the memory plan fits the device with a margin (faster), else on")
    liger: bool | Literal["auto"] = "auto"
    lm_head_tokens: Literal["all", "labelled"] = Field(
        "all", description="the next-token loss on TRL's fused LM head: all: every position through the head, "
        "the unlabelled ones' log-probabilities zeroed (no host sync, as the bare loops); labelled: only the "
        "labelled positions (TRL's own boolean-mask gather: a host sync in the forward and one in the backward, "
        "less head work where many tokens are unlabelled, e.g. prompts under completion-only loss or padding)")

    lm_head_kernel: Literal["auto", "trl", "liger"] = Field(
        "auto", description="the next-token loss with output.step_metrics loss on a GPU: trl: TRL's fused LM head "
        "(its backward recomputes each logits tile); liger: Liger's fused linear cross-entropy (gradients in the "
        "forward, no recompute; needs train.liger); auto: liger where Liger is on and the head is frozen (LoRA, "
        "QLoRA: one head GEMM fewer a step) or, on full fine-tuning, Liger's chunks of the micro-batch are >= 512 "
        "rows (planning/heads.py: measured faster there, slower at 128), else trl")

    router_aux_loss_coef: Literal["auto"] | float = Field(
        "auto", description="the next-token loss on a mixture-of-experts model (GPT-OSS, Qwen3-MoE, Mixtral): the weight of the "
        "router's load-balancing loss added to the training loss; auto: the model config's own "
        "(router_aux_loss_coef in config.json, TRL's default); 0 trains without it. Refused on a model that has no "
        "router")

    @field_validator("router_aux_loss_coef")
    @classmethod
    def _aux(cls, v):
        if v != "auto" and not (0 <= v < float("inf")):
            raise ValueError("must be auto or a number >= 0")
        return v

    @field_validator("max_steps")
    @classmethod
    def _steps(cls, v: int) -> int:
        if v != -1 and v < 1:
            raise ValueError(f"{v}: at least 1, or -1 to run train.epochs epochs")
        return v

    @field_validator("learning_rate")
    @classmethod
    def _lr(cls, v: float) -> float:
        # Fine-tuning rates are 1e-6..1e-2; above 1 every optimizer here diverges to NaN weights.
        if v > 1.0:
            raise ValueError(f"{v!r} cannot train (above 1 the weights diverge); typical: 1e-5 to 1e-3")
        return v


class ExportCfg(_Strict):
    """One `output.export` item, written `merged`, `gguf`, `gguf:q8_0,q4_k_m` or `gguf:q4_k_m+ollama`
    (the quant types are export-model's, checked before training: commands/finetune.py)."""
    to: Literal["merged", "gguf"]
    quants: tuple[str, ...] = ()  # gguf: the types (none written: f16)
    ollama: bool = False  # gguf: an Ollama Modelfile beside it

    @model_validator(mode="before")
    @classmethod
    def _text(cls, v: Any) -> Any:
        if not isinstance(v, str):
            return v
        body, _, flag = v.partition("+")
        to, _, quants = body.partition(":")
        if to not in ("merged", "gguf") or flag not in ("", "ollama") or (to == "merged" and (quants or flag)):
            raise ValueError(f"{v!r}: expected merged, gguf, gguf:TYPES or gguf:TYPES+ollama")
        return {"to": to, "quants": tuple(q.strip().lower() for q in quants.split(",") if q.strip()),
                "ollama": bool(flag)}


class OutputCfg(_Strict):
    dir: str
    save_steps: int = Field(0, ge=0, description="checkpoint every N steps; 0: none")
    keep_checkpoints: int = Field(2, gt=0, description="keep the newest K checkpoints")
    save: Literal["adapter", "merged", "both"] = "adapter"
    logging_steps: int = Field(1, gt=0)
    step_metrics: Literal["loss", "deferred", "synced"] = Field(
        "loss", description="the next-token loss's per-step metrics besides the loss. loss: no entropy or token accuracy "
        "computed (TRL's fused LM head asked for the log-probabilities alone), the token counts summed on "
        "the device and read at each log step; deferred: TRL's entropy and token accuracy too, summed on the "
        "device and read at each log step; synced: all read back every step as TRL and transformers do (a "
        "host sync each)")
    nan_inf_filter: bool = Field(False, description="transformers' per-step NaN/Inf loss filter (a host sync "
                                 "every step); off, a NaN/inf loss stops the run at the next log step")
    eval_steps: int | None = Field(None, gt=0)
    tensorboard: bool = Field(False, description="the same as tensorboard in report_to")
    report_to: list[Tracker] = Field(default_factory=list, description="experiment trackers (transformers' "
                                     "callbacks): tensorboard, mlflow, wandb, trackio; settings in the sections below")
    run_name: str | None = Field(None, description="the run's name in every tracker; unset: output.dir's name")
    mlflow: MlflowCfg = MlflowCfg()
    wandb: WandbCfg = WandbCfg()
    trackio: TrackioCfg = TrackioCfg()
    progress_bar: bool = True
    export: list[ExportCfg] = Field(default_factory=list, description="run `export-model` at the end: merged, "
                                    "gguf, gguf:q8_0,q4_k_m, gguf:q4_k_m+ollama")

    _dir = field_validator("dir")(_openable)


class VisionCfg(_Strict):
    """Image rows (vision-language SFT): which parts of the model train."""
    train: list[Literal["language", "vision", "projector"]] = Field(
        ["language"], min_length=1, description="the parts that train on image rows: language (the language "
        "model), vision (the vision tower), projector (the vision-to-text projection); the vision tower frozen "
        "by default, as the peers have it")
    min_pixels: int | None = Field(None, gt=0, description="Qwen-VL: an image is scaled up to at least this many "
                                   "pixels (null: the processor's own)")
    max_pixels: int | None = Field(None, gt=0, description="Qwen-VL: an image is scaled down to at most this many "
                                   "pixels, which bounds its tokens (null: the processor's own)")

    @field_validator("max_pixels")
    @classmethod
    def _budget(cls, v, info):
        lo = info.data.get("min_pixels")
        if v is not None and lo is not None and v < lo:
            raise ValueError(f"{v} is below vision.min_pixels ({lo})")
        return v


class _Config(_Strict):
    model: ModelCfg
    data: DataCfg

    @field_validator("method", "objective", mode="before", check_fields=False)
    @classmethod
    def _lower(cls, v: Any) -> Any:
        return v.lower() if isinstance(v, str) else v


# The objectives and their sections come from the registry (units/registry.py), the one list of them.
TrainConfig = create_model(
    "TrainConfig", __base__=_Config, __module__=__name__,
    objective=(Literal[tuple(registry.REGISTRY)], registry.DEFAULT),
    **{name: (u.section, u.section()) for name, u in registry.REGISTRY.items() if u.section},
    method=(Literal["full", "lora", "qlora", "lora-8bit"], "lora"),
    lora=(LoraCfg, LoraCfg()),
    backend=(Literal["auto", "hf", "unsloth"], "auto"),
    train=(TrainCfg, TrainCfg()),
    vision=(VisionCfg, VisionCfg()),
    output=(OutputCfg, ...),
)


def _parse_value(raw: str) -> Any:
    # YAML scalars, so `--set train.learning_rate=1e-4` and `--set data.packing=true` type themselves.
    try:
        return load_text(raw, "--set").data
    except SafeYamlError:  # not YAML (or a tag, a bomb, deep nesting): the text as given
        return raw


def apply_overrides(data: dict[str, Any], overrides: Sequence[str]) -> dict[str, Any]:
    data = copy.deepcopy(data)
    for item in overrides:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise UserError(f"--set {item!r}: expected key.path=value")
        node = data
        parts = key.strip().split(".")
        for p in parts[:-1]:
            nxt = node.setdefault(p, {})
            if not isinstance(nxt, dict):
                raise UserError(f"--set {item!r}: {p!r} is not a section")
            node = nxt
        node[parts[-1]] = _parse_value(raw)
    return data


def load_config(config: dict | str | Path, overrides: Sequence[str] = ()) -> tuple[TrainConfig, Path]:
    """Return the validated config and the folder relative paths in it are resolved against."""
    cfg, base, _ = load_located(config, overrides)
    return cfg, base


def load_located(config: dict | str | Path, overrides: Sequence[str] = ()) -> tuple[TrainConfig, Path, Callable]:
    """load_config, and `where(message)`: the message of a later check on a field, prefixed with
    where the field is written (`train.yaml:12: ...`, or `--set ...`), unchanged when it names none."""
    if isinstance(config, (str, Path)):
        path = Path(config)
        source = str(path)
        why = path_problem(str(path))
        if why:
            raise UserError(f"--config: {why}")
        kind = special_file(path)
        if kind:  # a FIFO would block the read for ever
            raise UserError(f"{path}: {kind}, not a regular file (it is not read)")
        if not path.is_file():
            raise UserError(f"{path}: config file not found")
        doc = load_file(path, what="train config")  # SafeYamlError: file:line:col, exit 2
        data, marks = (doc.data if doc.data is not None else {}), doc.marks
        base = path.resolve().parent
    else:
        data, source, base, marks = config, "config", Path.cwd(), {}
    if not isinstance(data, dict):
        raise UserError(f"{source}: expected a mapping at the top level")
    data = apply_overrides(data, overrides)
    try:
        cfg = TrainConfig.model_validate(data)
    except ValidationError as exc:
        raise UserError(fmt_errors(exc, source, marks, overrides)) from None

    def where(message: str) -> str:
        m = re.match(r"([a-z_]+(?:\.(?:[a-z_]+|\d+))*): ", message)  # data.sources.1.weight, grpo.rewards.0.function: a list item's index
        if not m or m.group(1).split(".")[0] not in TrainConfig.model_fields:
            return message
        field = m.group(1)
        item = set_item(field, overrides)
        if item is not None:
            return f"--set {item}: {message}"
        path = tuple(int(x) if x.isdigit() else x for x in field.split("."))
        while path and path not in marks:
            path = path[:-1]
        return f"{source}:{marks[path][0]}: {message}" if path in marks else f"{source}: {message}"

    why = cfg.data.problem()
    if why:
        raise UserError(where(why))
    return cfg, base, where
