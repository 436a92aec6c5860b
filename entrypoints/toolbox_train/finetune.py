"""`finetune --config train.yaml [--set k=v ...] [--resume] [--overwrite]`.

TRL's SFTTrainer on both backends: Unsloth (where it imports and a GPU is present) or
plain Hugging Face. Everything that can be wrong with the input is checked before the
model is loaded (exit 2, nothing written).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import yaml

from . import checkpoints
from .config import TrainConfig, load_config
from .data import load_datasets, looks_like_hub_id, resolve_local
from .errors import ToolError, UserError

# Files `launch` writes into the output folder before finetune starts.
LAUNCH_DIR = "launch"
MODEL_ROOT_TYPES_MULTIMODAL = {"gemma3", "gemma3n", "llava", "mllama", "qwen2_5_vl", "qwen3_vl"}
VISION_PARTS = ("vision_tower", "multi_modal_projector", "vision_model", "visual")


def log(msg: str) -> None:
    if int(os.environ.get("RANK", "0")) == 0:
        print(f"finetune: {msg}", file=sys.stderr, flush=True)


@dataclass
class Dist:
    world_size: int = 1
    rank: int = 0
    local_rank: int = 0

    @classmethod
    def from_env(cls) -> "Dist":
        return cls(int(os.environ.get("WORLD_SIZE", "1")), int(os.environ.get("RANK", "0")),
                   int(os.environ.get("LOCAL_RANK", "0")))


def using_fsdp() -> bool:
    return os.environ.get("ACCELERATE_USE_FSDP", "false").lower() in ("1", "true")


@dataclass
class Plan:
    """What the checks resolved: everything needed to train, nothing heavy loaded."""

    cfg: TrainConfig
    base: Path
    out: Path
    model_path: str
    model_config: Any
    backend: str
    multimodal: bool
    grad_accum: int
    world_size: int
    gpu: bool
    precision: str
    liger: bool
    resume_from: Path | None = None
    notes: list[str] = field(default_factory=list)


def resolve_model(cfg: TrainConfig, base: Path) -> str:
    local = resolve_local(cfg.model.path, base)
    if local is not None:
        if not (local / "config.json").is_file():
            raise UserError(f"model.path: {local}: no config.json (not a model folder)")
        return str(local)
    if not looks_like_hub_id(cfg.model.path):
        raise UserError(f"model.path: {cfg.model.path}: no such folder")
    return cfg.model.path


def load_model_config(path: str, cfg: TrainConfig):
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


def pick_backend(cfg: TrainConfig, gpu: bool, fsdp: bool) -> str:
    have_unsloth = importlib.util.find_spec("unsloth") is not None
    if cfg.backend == "unsloth":
        if fsdp:
            raise UserError("backend: unsloth does not support FSDP; use `--strategy ddp` or backend: hf")
        if not gpu or not have_unsloth:
            raise UserError("backend: unsloth needs the unsloth package and a GPU "
                            f"(unsloth installed: {have_unsloth}, GPU: {gpu}); use backend: hf or auto")
        return "unsloth"
    if cfg.backend == "auto":
        return "unsloth" if (gpu and have_unsloth and not fsdp) else "hf"
    return "hf"


def output_problem(out: Path, resume: bool, overwrite: bool) -> str | None:
    if not out.exists():
        return None
    if not out.is_dir():
        return f"output.dir: {out}: exists and is not a folder"
    entries = [p.name for p in out.iterdir() if p.name != LAUNCH_DIR]
    if entries and not resume and not overwrite:
        return (f"output.dir: {out}: not empty ({', '.join(sorted(entries)[:5])}); "
                "pass --resume to continue or --overwrite to start over")
    return None


def batch_plan(cfg: TrainConfig, world: int) -> int:
    t = cfg.train
    if t.batch_size is None:
        return t.gradient_accumulation_steps
    per_step = world * t.per_device_batch_size
    if t.batch_size % per_step:
        raise UserError(f"train.batch_size: {t.batch_size} is not divisible by world size {world} x "
                        f"train.per_device_batch_size {t.per_device_batch_size} = {per_step}")
    return t.batch_size // per_step


def plan(config, overrides: Sequence[str] = (), resume: bool = False, overwrite: bool = False,
         world_size: int | None = None, check_output: bool = True, fsdp: bool | None = None,
         gpu: bool | None = None, import_backend: bool = True) -> Plan:
    """All the cheap checks, in order; raises UserError on the first bad input."""
    cfg, base = load_config(config, overrides)
    if resume and overwrite:
        raise UserError("--resume and --overwrite exclude each other")
    out = Path(cfg.output.dir).expanduser()
    out = (out if out.is_absolute() else Path.cwd() / out).resolve()
    world = world_size or Dist.from_env().world_size
    if check_output:
        why = output_problem(out, resume, overwrite)
        if why:
            raise UserError(why)
    grad_accum = batch_plan(cfg, world)
    fsdp = using_fsdp() if fsdp is None else fsdp
    gpu = gpu_available() if gpu is None else gpu
    backend = pick_backend(cfg, gpu, fsdp)
    if cfg.method in ("qlora", "lora-8bit"):
        if not gpu or importlib.util.find_spec("bitsandbytes") is None:
            raise UserError(f"method: {cfg.method} needs bitsandbytes and a GPU for quantized weights "
                            f"(GPU: {gpu}); use lora or full here")
        if fsdp and cfg.method == "lora-8bit":
            raise UserError("method: lora-8bit does not shard under FSDP; use qlora or lora")
    if backend == "unsloth" and import_backend:
        # docs/benchmarks.md: Unsloth's auto padding-free cost 9% tokens/s (LoRA, H200, full-length
        # rows) and put finetune under the bare Unsloth loop; read when unsloth is imported.
        os.environ.setdefault("UNSLOTH_DISABLE_AUTO_PADDING_FREE", "1")
        import unsloth  # noqa: F401  (must come before transformers/trl/peft to patch them)
    from transformers.trainer_utils import SchedulerType
    from transformers.training_args import OptimizerNames

    for fld, value, enum in (("train.optimizer", cfg.train.optimizer, OptimizerNames),
                             ("train.lr_scheduler", cfg.train.lr_scheduler, SchedulerType)):
        names = [e.value for e in enum]
        if value not in names:
            raise UserError(f"{fld}: {value!r} is not one of {', '.join(names)}")
    model_path = resolve_model(cfg, base)
    mc = load_model_config(model_path, cfg)
    tc = text_config(mc)
    max_pos = getattr(tc, "max_position_embeddings", None)
    if max_pos and cfg.data.max_seq_length > max_pos:
        raise UserError(f"data.max_seq_length: {cfg.data.max_seq_length} is above the model's maximum "
                        f"({max_pos}, max_position_embeddings in {model_path})")
    if cfg.train.precision == "auto":
        import torch

        precision = "bf16" if gpu and torch.cuda.is_bf16_supported() else "fp32"
    else:
        precision = cfg.train.precision
    if precision in ("bf16", "fp16") and not gpu:
        raise UserError(f"train.precision: {precision} needs a GPU here; use fp32 or auto on CPU")
    liger = cfg.train.liger
    if liger == "auto":
        # The benchmark: Liger cut peak memory 2.3x and raised tokens/s on the HF path (GPU only).
        liger = backend == "hf" and gpu and importlib.util.find_spec("liger_kernel") is not None
    elif liger:
        if backend != "hf":
            raise UserError("train.liger: only on backend hf (Unsloth has its own kernels)")
        if not gpu or importlib.util.find_spec("liger_kernel") is None:
            raise UserError("train.liger: true needs the liger-kernel package and a GPU")
    if cfg.output.tensorboard and not (importlib.util.find_spec("tensorboard") or importlib.util.find_spec("tensorboardX")):
        raise UserError("output.tensorboard: true needs the tensorboard package (pip install tensorboard)")
    p = Plan(cfg, base, out, model_path, mc, backend, is_multimodal(mc), grad_accum, world, gpu,
             precision, bool(liger))
    if resume:
        p.resume_from = checkpoints.newest_complete(out / "checkpoints")
        if p.resume_from is None:
            p.notes.append("--resume: no complete checkpoint found, starting from the beginning")
    return p


# ---------------------------------------------------------------- model loading


def lora_targets(p: Plan):
    t = p.cfg.lora.target_modules
    if not p.multimodal:
        return t
    # Text-only fine-tuning of a multimodal wrapper: adapters on the language model only.
    import re

    names = ("q_proj|k_proj|v_proj|o_proj|gate_proj|up_proj|down_proj" if t == "all-linear"
             else "|".join(re.escape(x) for x in t))
    return rf"^(?!.*({'|'.join(VISION_PARTS)})).*\.({names})$"


def peft_config(p: Plan):
    from peft import LoraConfig

    c = p.cfg.lora
    return LoraConfig(r=c.r, lora_alpha=c.alpha, lora_dropout=c.dropout, target_modules=lora_targets(p),
                      bias="none", task_type="CAUSAL_LM")


def torch_dtype(p: Plan):
    import torch

    return {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[p.precision]


def load_hf(p: Plan, dist: Dist):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    kw: dict[str, Any] = dict(revision=p.cfg.model.revision, trust_remote_code=p.cfg.model.trust_remote_code,
                              dtype=torch_dtype(p))
    if p.cfg.model.attn_implementation:
        kw["attn_implementation"] = p.cfg.model.attn_implementation
    if p.gpu and not using_fsdp():
        kw["device_map"] = {"": dist.local_rank}  # each DDP rank on its own device
    if p.cfg.method in ("qlora", "lora-8bit"):
        from transformers import BitsAndBytesConfig

        kw["quantization_config"] = (
            BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
                               bnb_4bit_compute_dtype=torch.bfloat16, bnb_4bit_quant_storage=torch.bfloat16)
            if p.cfg.method == "qlora" else BitsAndBytesConfig(load_in_8bit=True))
    tok = AutoTokenizer.from_pretrained(p.model_path, revision=p.cfg.model.revision,
                                        trust_remote_code=p.cfg.model.trust_remote_code)
    model = AutoModelForCausalLM.from_pretrained(p.model_path, **kw)
    if p.multimodal:
        # Text data never reaches the vision tower: freeze it so DDP needs no unused-parameter search.
        for name, prm in model.named_parameters():
            if any(part in name for part in VISION_PARTS):
                prm.requires_grad_(False)
    return model, tok, (peft_config(p) if p.cfg.method != "full" else None)


def load_unsloth(p: Plan, dist: Dist):
    from unsloth import FastLanguageModel, FastModel

    # FastModel handles Gemma 3 (and its multimodal wrapper); FastLanguageModel the text-only families.
    loader = FastModel if (p.multimodal or p.model_config.model_type.startswith("gemma3")) else FastLanguageModel
    gc = p.cfg.train.gradient_checkpointing
    use_gc = "unsloth" if gc in (True, "unsloth") else False
    model, tok = loader.from_pretrained(
        model_name=p.model_path,
        max_seq_length=p.cfg.data.max_seq_length,
        dtype=None if p.precision == "fp32" else torch_dtype(p),
        load_in_4bit=p.cfg.method == "qlora",
        load_in_8bit=p.cfg.method == "lora-8bit",
        load_in_16bit=p.cfg.method == "lora",  # Unsloth's loader defaults to 4-bit otherwise
        full_finetuning=p.cfg.method == "full",
        device_map={"": dist.local_rank} if dist.world_size > 1 else "sequential",
        use_gradient_checkpointing=use_gc,
        trust_remote_code=p.cfg.model.trust_remote_code,
        revision=p.cfg.model.revision,
    )
    tok = getattr(tok, "tokenizer", tok)  # FastModel returns a processor for multimodal models
    if p.cfg.method != "full":
        c = p.cfg.lora
        kw: dict[str, Any] = dict(r=c.r, lora_alpha=c.alpha, lora_dropout=c.dropout, bias="none",
                                  use_gradient_checkpointing=use_gc, random_state=p.cfg.train.seed)
        if c.target_modules != "all-linear":
            kw["target_modules"] = c.target_modules
        elif loader is FastLanguageModel:
            kw["target_modules"] = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
        if loader is FastModel:
            kw.update(finetune_vision_layers=False, finetune_language_layers=True,
                      finetune_attention_modules=True, finetune_mlp_modules=True)
        model = loader.get_peft_model(model, **kw)
    return model, tok, None


# ---------------------------------------------------------------- training


def peak_mem_gib() -> float:
    import torch

    if torch.cuda.is_available():
        return torch.cuda.max_memory_allocated() / 2**30
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB on Linux


def make_callbacks(p: Plan, summary: dict):
    from transformers import TrainerCallback

    metrics_path = p.out / "metrics.jsonl"
    stop_after = int(os.environ.get("TOOLBOX_STOP_AFTER_STEP", "0") or 0)

    class Metrics(TrainerCallback):
        """One JSON line per logged optimizer step (rank 0), plus what the summary needs."""

        def __init__(self):
            self.t0 = self.t_last = None
            self.tok_last = 0
            self.tok0 = None

        def on_train_begin(self, args, state, control, **kw):
            self.t0 = self.t_last = time.perf_counter()
            self.tok_last = self.tok0 = state.num_input_tokens_seen

        def on_log(self, args, state, control, logs=None, **kw):
            if not state.is_world_process_zero or not logs or "loss" not in logs:
                return
            now = time.perf_counter()
            tokens = int(state.num_input_tokens_seen)
            row = {
                "step": state.global_step,
                "loss": float(logs["loss"]),
                "lr": float(logs.get("learning_rate", 0.0)),
                "tokens": tokens,
                "tokens_per_s": (tokens - self.tok_last) / max(now - self.t_last, 1e-9),
                "peak_mem_gib": round(peak_mem_gib(), 4),
            }
            if "grad_norm" in logs:
                row["grad_norm"] = float(logs["grad_norm"])
            self.t_last, self.tok_last = now, tokens
            with metrics_path.open("a") as f:
                f.write(json.dumps(row) + "\n")
            summary.setdefault("first_loss", row["loss"])
            summary["last_loss"] = row["loss"]

        def on_step_end(self, args, state, control, **kw):
            if stop_after and state.global_step >= stop_after:
                # Test hook: an interruption after step k (the checkpoint of step k is still written).
                control.should_training_stop = True

        def on_train_end(self, args, state, control, **kw):
            dt = time.perf_counter() - (self.t0 or time.perf_counter())
            summary["steps"] = state.global_step
            summary["tokens_per_s"] = (state.num_input_tokens_seen - (self.tok0 or 0)) / max(dt, 1e-9)

    return [Metrics()]


def local_sgd_steps() -> int:
    sync = os.environ.get("TOOLBOX_SYNC", "every-step")
    if sync in ("", "every-step"):
        return 0
    if sync.startswith("local-sgd:") and sync.split(":", 1)[1].isdigit() and int(sync.split(":", 1)[1]) > 0:
        return int(sync.split(":", 1)[1])
    raise UserError(f"TOOLBOX_SYNC={sync!r}: expected every-step or local-sgd:K (K > 0)")


def fused_head_ok(inputs) -> bool:
    from trl.trainer import utils as trl_utils

    ids = inputs.get("input_ids")
    return getattr(trl_utils, "_ChunkedLogProbFunction", None) is not None and (ids is None or ids.is_cuda)


def trainer_class(p: Plan):
    from trl import SFTTrainer

    ksteps = local_sgd_steps()

    class Trainer(SFTTrainer):
        """SFTTrainer with atomic checkpoints (temp name, then rename; keep last K) and LocalSGD."""

        _staging: str | None = None
        _local_sgd = None

        def _get_output_dir(self, trial):
            return self._staging or super()._get_output_dir(trial)

        def _save_checkpoint(self, model, trial):
            root = Path(self.args.output_dir)
            # Per node: with several nodes each saves its own copy (save_on_each_node), into one
            # shared folder or each into its own disk.
            staging = root / f"{checkpoints.PARTIAL}-node{os.environ.get('GROUP_RANK', '0')}"
            name = f"{checkpoints.PREFIX}{self.state.global_step}"
            if self.is_local_process_zero():
                shutil.rmtree(staging / name, ignore_errors=True)
                staging.mkdir(parents=True, exist_ok=True)
            self.accelerator.wait_for_everyone()
            self._staging = str(staging)
            try:
                if self._local_sgd is not None:
                    self._local_sgd._sync_and_avg_model_params()  # save what every rank agrees on
                super()._save_checkpoint(model, trial)
            finally:
                self._staging = None
            self.accelerator.wait_for_everyone()
            if self.is_local_process_zero() and (staging / name).exists():
                checkpoints.publish(staging / name, root / name)
                try:
                    staging.rmdir()
                except OSError:
                    pass
                checkpoints.rotate(root, p.cfg.output.keep_checkpoints)
            self.accelerator.wait_for_everyone()

        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            if fused_head_ok(inputs):
                return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
            # TRL's fused LM-head loss is a Triton kernel (GPU only): on CPU use the model's own loss.
            from transformers import Trainer as HFTrainer

            return HFTrainer.compute_loss(self, model, inputs, return_outputs, num_items_in_batch)

        grad_allreduce_calls = 0

        def _count_allreduces(self, model):
            # Test hook (TOOLBOX_COUNT_GRAD_ALLREDUCE=1): DDP's own all-reduce, counted per bucket.
            from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

            def hook(state, bucket):
                self.grad_allreduce_calls += 1
                return allreduce_hook(state, bucket)

            model.register_comm_hook(None, hook)

        def training_step(self, model, inputs, num_items_in_batch=None):
            if not getattr(self, "_hooked", False):
                self._hooked = True
                if os.environ.get("TOOLBOX_COUNT_GRAD_ALLREDUCE") == "1" and hasattr(model, "register_comm_hook"):
                    self._count_allreduces(model)
            if ksteps and self.accelerator.num_processes > 1:
                if self._local_sgd is None:
                    from accelerate.local_sgd import LocalSGD

                    self._local_sgd = LocalSGD(self.accelerator, model, ksteps, enabled=True)
                    log(f"LocalSGD: averaging parameters every {ksteps} optimizer steps (no per-step all-reduce)")
                # Per micro-step, so it nests inside the Trainer's own no_sync of accumulation steps
                # (one no_sync held for the whole run is undone when an inner one exits).
                with model.no_sync():
                    return super().training_step(model, inputs, num_items_in_batch)
            return super().training_step(model, inputs, num_items_in_batch)

        def _load_optimizer_and_scheduler(self, checkpoint):
            if p.gpu or checkpoint is None:
                return super()._load_optimizer_and_scheduler(checkpoint)
            # CPU ranks save their optimizer state tagged "cpu:0", and transformers loads it with
            # map_location=args.device under DDP, which torch cannot restore: map to plain "cpu".
            import torch

            orig = torch.load

            def load(f, *a, **kw):
                kw["map_location"] = "cpu"
                return orig(f, *a, **kw)

            torch.load = load
            try:
                return super()._load_optimizer_and_scheduler(checkpoint)
            finally:
                torch.load = orig

        def optimizer_step_done(self):
            if self._local_sgd is not None:
                self._local_sgd.step()

        def finish_local_sgd(self):
            if self._local_sgd is not None:
                self._local_sgd._sync_and_avg_model_params()  # the last average, as LocalSGD's __exit__ does
                self._local_sgd = None

    return Trainer


def sft_args(p: Plan, dist: Dist):
    from trl import SFTConfig

    c, t, o = p.cfg, p.cfg.train, p.cfg.output
    gc = t.gradient_checkpointing
    # Unsloth sets up its own (offloaded) checkpointing; under FSDP the accelerate config's
    # fsdp_activation_checkpointing does it (transformers refuses both at once).
    hf_gc = bool(gc) and p.backend == "hf" and not using_fsdp()
    has_eval = bool(c.data.eval_path or c.data.eval_split > 0)
    if o.tensorboard:
        os.environ.setdefault("TENSORBOARD_LOGGING_DIR", str(p.out / "tensorboard"))
    return SFTConfig(
        output_dir=str(p.out / "checkpoints"),
        per_device_train_batch_size=t.per_device_batch_size,
        per_device_eval_batch_size=t.per_device_batch_size,
        gradient_accumulation_steps=p.grad_accum,
        learning_rate=t.learning_rate,
        lr_scheduler_type=t.lr_scheduler,
        warmup_steps=t.warmup_ratio if t.warmup_ratio > 0 else t.warmup_steps,
        weight_decay=t.weight_decay,
        optim=t.optimizer,
        max_grad_norm=t.max_grad_norm,
        num_train_epochs=t.epochs,
        max_steps=t.max_steps,
        seed=t.seed,
        data_seed=t.seed,
        bf16=p.precision == "bf16",
        fp16=p.precision == "fp16",
        use_cpu=not p.gpu,
        logging_steps=o.logging_steps,
        logging_first_step=True,
        save_strategy="steps" if o.save_steps else "no",
        save_steps=o.save_steps or 500,
        save_total_limit=None,  # rotation is ours, after the rename
        eval_strategy="steps" if has_eval and o.eval_steps else ("epoch" if has_eval else "no"),
        eval_steps=o.eval_steps,
        report_to=["tensorboard"] if o.tensorboard else "none",
        disable_tqdm=not o.progress_bar or dist.rank != 0,
        gradient_checkpointing=hf_gc,
        gradient_checkpointing_kwargs={"use_reentrant": False} if hf_gc else None,
        max_length=c.data.max_seq_length,
        packing=c.data.packing,
        shuffle_dataset=c.data.shuffle,
        dataset_text_field="text",
        ddp_find_unused_parameters=False,
        use_liger_kernel=p.liger,
        include_num_input_tokens_seen="non_padding",
        dataloader_num_workers=0,
        save_only_model=False,
        save_on_each_node=dist.world_size > int(os.environ.get("LOCAL_WORLD_SIZE", dist.world_size)),
        restore_callback_states_from_checkpoint=False,
    )


def _atomic_write(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def _trim_metrics(path: Path, upto: int) -> None:
    # Resuming from step k: drop the lines of steps after k that the interrupted run logged.
    if path.exists():
        keep = [ln for ln in path.read_text().splitlines() if ln.strip() and json.loads(ln)["step"] <= upto]
        _atomic_write(path, "".join(ln + "\n" for ln in keep))


def run(config: dict | str | Path, overrides: Sequence[str] = (), resume: bool = False,
        overwrite: bool = False) -> dict:
    """Fine-tune per `config`; returns the summary (output_dir, steps, tokens_per_s, first/last loss, peak_mem_gib)."""
    dist = Dist.from_env()
    if int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") or 0) > 0:
        # torchrun restarted the ranks (launch --max-restarts): continue, never start over.
        resume, overwrite = True, False
        log(f"restart {os.environ['TORCHELASTIC_RESTART_COUNT']}: resuming from the newest complete checkpoint")
    p = plan(config, overrides, resume=resume, overwrite=overwrite, check_output=dist.rank == 0)
    train_ds, eval_ds, fmt = load_datasets(p.cfg, p.base)  # bad data is still bad input: before the model
    for n in p.notes:
        log(n)
    log(f"backend {p.backend}, method {p.cfg.method}, data {fmt} ({len(train_ds)} rows), "
        f"precision {p.precision}, world size {p.world_size}, grad accumulation {p.grad_accum}, liger {p.liger}")

    if dist.rank == 0:
        if overwrite and p.out.exists():
            for child in p.out.iterdir():
                if child.name != LAUNCH_DIR:
                    shutil.rmtree(child) if child.is_dir() and not child.is_symlink() else child.unlink()
        p.out.mkdir(parents=True, exist_ok=True)
        if p.resume_from is not None:
            step = json.loads((p.resume_from / "trainer_state.json").read_text())["global_step"]
            _trim_metrics(p.out / "metrics.jsonl", step)
            log(f"resuming from {p.resume_from}")
        resolved = p.cfg.model_dump(mode="json")
        resolved["model"]["path"] = p.model_path
        resolved["_resolved"] = {"backend": p.backend, "precision": p.precision, "world_size": p.world_size,
                                 "gradient_accumulation_steps": p.grad_accum, "liger": p.liger,
                                 "data_format": fmt, "sync": os.environ.get("TOOLBOX_SYNC", "every-step")}
        _atomic_write(p.out / "config.resolved.yaml", yaml.safe_dump(resolved, sort_keys=False))

    import transformers

    transformers.set_seed(p.cfg.train.seed)  # LoRA init and anything random before the Trainer
    model, tok, peft_cfg = load_unsloth(p, dist) if p.backend == "unsloth" else load_hf(p, dist)
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token

    summary: dict[str, Any] = {"output_dir": str(p.out)}
    args = sft_args(p, dist)
    Trainer = trainer_class(p)
    from transformers import TrainerCallback

    class _LocalSGDStep(TrainerCallback):
        def on_step_end(self, args_, state, control, **kw):
            trainer.optimizer_step_done()

    trainer = Trainer(model=model, args=args, train_dataset=train_ds, eval_dataset=eval_ds,
                      processing_class=tok, peft_config=peft_cfg,
                      callbacks=make_callbacks(p, summary) + [_LocalSGDStep()])
    if args.save_on_each_node:
        # transformers 5.x writes model weights on global rank 0 only, whatever save_on_each_node
        # says; each node's first rank must write them too, or no other node can resume.
        from transformers import PreTrainedModel

        for mod in trainer.model.modules():
            if isinstance(mod, PreTrainedModel):
                mod.should_save_on_this_rank = lambda is_main_process: is_main_process
    if len(trainer.train_dataset) == 0:
        raise UserError(f"data: every example lost its whole completion to truncation at data.max_seq_length "
                        f"{p.cfg.data.max_seq_length}; raise it")
    try:
        trainer.train(resume_from_checkpoint=str(p.resume_from) if p.resume_from else None)
    finally:
        trainer.finish_local_sgd()
    save_final(p, trainer, tok)
    if trainer.accelerator.num_processes > 1 and not trainer.is_fsdp_enabled:
        # Every rank must end with the same weights (DDP, or LocalSGD after its last average).
        summary["rank_weight_sha256"] = trainer.accelerator.gather_for_metrics(
            [weights_digest(trainer.accelerator.unwrap_model(trainer.model))], use_gather_object=True)
    if os.environ.get("TOOLBOX_COUNT_GRAD_ALLREDUCE") == "1":
        summary["grad_allreduce_calls"] = trainer.grad_allreduce_calls
    summary["peak_mem_gib"] = round(peak_mem_gib(), 4)
    summary.setdefault("steps", trainer.state.global_step)
    if trainer.is_world_process_zero():
        rows = [json.loads(ln) for ln in (p.out / "metrics.jsonl").read_text().splitlines() if ln.strip()] \
            if (p.out / "metrics.jsonl").exists() else []
        if rows:  # the whole run's, a resumed one included
            summary["first_loss"], summary["last_loss"] = rows[0]["loss"], rows[-1]["loss"]
    summary.setdefault("first_loss", None)
    summary.setdefault("last_loss", None)
    if trainer.is_world_process_zero():
        _atomic_write(p.out / "summary.json", json.dumps(summary, indent=2) + "\n")
    return summary


def weights_digest(model) -> str:
    import hashlib

    h = hashlib.sha256()
    for name, prm in sorted(model.named_parameters(), key=lambda x: x[0]):
        h.update(name.encode())
        h.update(prm.detach().float().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


def save_final(p: Plan, trainer, tok) -> None:
    trainer.accelerator.wait_for_everyone()
    if trainer.is_fsdp_enabled:
        trainer.accelerator.state.fsdp_plugin.set_state_dict_type("FULL_STATE_DICT")
    what = p.cfg.output.save if p.cfg.method != "full" else "merged"
    if p.cfg.method == "full" or what in ("adapter", "both"):
        trainer.save_model(str(p.out))  # adapter (PEFT) or the whole model, safetensors
    if p.cfg.method != "full" and what in ("merged", "both") and trainer.is_world_process_zero():
        dest = p.out if what == "merged" else p.out / "merged"
        model = trainer.accelerator.unwrap_model(trainer.model)
        if p.backend == "unsloth":
            model.save_pretrained_merged(str(dest), tok, save_method="merged_16bit")
        else:
            model.merge_and_unload().save_pretrained(str(dest), safe_serialization=True)
            tok.save_pretrained(str(dest))
    if trainer.is_world_process_zero():
        tok.save_pretrained(str(p.out))
    trainer.accelerator.wait_for_everyone()


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="finetune", description="Fine-tune a causal LM per a train.yaml.")
    ap.add_argument("--config", required=True, help="train.yaml")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="override a config field, e.g. train.learning_rate=1e-4 (repeatable)")
    ap.add_argument("--resume", action="store_true", help="continue from the newest complete checkpoint")
    ap.add_argument("--overwrite", action="store_true", help="empty a non-empty output folder first")
    return ap


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        summary = run(args.config, args.set, resume=args.resume, overwrite=args.overwrite)
    except (UserError, ToolError) as exc:
        print(f"finetune: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("finetune: interrupted", file=sys.stderr)
        return 130
    if Dist.from_env().rank == 0:
        print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
