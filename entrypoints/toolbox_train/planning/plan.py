"""The checks of a fine-tuning run, and the Plan they resolve.

Everything that can be wrong with the input is found here, before a model is loaded or a file
is written (UserError: exit 2). `launch` runs the same checks for the world size it will start,
so this module imports nothing heavy at import time: no trainer, no TRL, no torch.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from toolbox_train.runs import checkpoints
from toolbox_train.config import tracking
from toolbox_train.config.schema import TrainConfig, load_located
from toolbox_train.data.dataset import looks_like_hub_id, resolve_local
from toolbox_train.runs.folder import RESOLVED_CONFIG
from toolbox_train.contract import UserError
from toolbox_train.guards import cannot_make, unwritable
from toolbox_train.planning import heads
from toolbox_train.models.vision import plan_note as vision_note
from toolbox_train.config.sync import DEFAULT as SYNC_DEFAULT, from_env as sync_from_env

# Files `launch` writes into the output folder before finetune starts.
LAUNCH_DIR = "launch"
# A file `launch` names in this variable; finetune writes it when the node has finished.
FINISHED_ENV = "TOOLBOX_FINISHED_FILE"
FINISHED = "finished"


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
    gradient_checkpointing: bool | str = True  # resolved (train.gradient_checkpointing: auto)
    lm_head_kernel: str = "trl"  # resolved (train.lm_head_kernel: auto; planning/heads.py)
    memory: Any = None  # planning.memory.MemoryPlan: the memory plan and why checkpointing is what it is
    sync: str = SYNC_DEFAULT  # every-step or local-sgd:K (see sync.py)
    lora_params: int | None = None  # the adapter's size as PEFT built it (meta device), where the planner's arithmetic falls short
    # A later check's message on a config field, prefixed with where the field is written.
    locate: Callable[[str], str] = field(default=lambda message: message, repr=False)


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


TRL_FOR_OBJECTIVES = "1.15.0"  # what the objectives are written against (objectives/<name>_trainer.py)


def trl_problem(cfg: TrainConfig) -> None:
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
                        "image or upgrade this environment's TRL, or use objective sft")


def pick_backend(cfg: TrainConfig, gpu: bool, fsdp: bool, machine=None) -> str:
    # Planning for another machine (`machine`): the toolbox image there has Unsloth, whatever is installed here.
    have_unsloth = machine is not None or importlib.util.find_spec("unsloth") is not None
    if cfg.backend == "unsloth":
        if fsdp:
            raise UserError("backend: unsloth does not support FSDP; use `--strategy ddp` or backend: hf")
        if not gpu or not have_unsloth:
            raise UserError("backend: unsloth needs the unsloth package and a GPU "
                            f"(unsloth installed: {have_unsloth}, GPU: {gpu}); use backend: hf or auto")
        return "unsloth"
    if cfg.backend == "auto":
        if cfg.objective in ("dpo", "grpo"):
            # Measured, auto takes the faster path: DPO (issue 24, H200, llama-1b, TRL 1.15) DPOTrainer + PEFT
            # 13.1 pairs/s, under Unsloth 2026.10.9 8.9; GRPO (H100, llama-1b LoRA, docs/preference.md) hf's static
            # sampler 1.59 s a step, TRL's default 9.19, Unsloth's rows stopped at step 1; vllm-colocate is TRL's
            return "hf"
        return "unsloth" if (gpu and have_unsloth and not fsdp) else "hf"
    return "hf"


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


def model_files_problem(model_path: str, cfg: TrainConfig) -> str | None:
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


def batch_plan(cfg: TrainConfig, world: int) -> int:
    t = cfg.train
    if t.batch_size is None:
        return t.gradient_accumulation_steps
    if t.per_device_batch_size == "auto":
        return 1  # the memory plan picks the batch, then this is asked again
    per_step = world * t.per_device_batch_size
    if t.batch_size % per_step:
        raise UserError(f"train.batch_size: {t.batch_size} is not divisible by world size {world} x "
                        f"train.per_device_batch_size {t.per_device_batch_size} = {per_step}")
    return t.batch_size // per_step


def plan(config, overrides: Sequence[str] = (), resume: bool = False, overwrite: bool = False,
         world_size: int | None = None, check_output: bool = True, fsdp: bool | None = None,
         gpu: bool | None = None, import_backend: bool = True, sync_mode: str | None = None,
         device_memory: str | None = None, probe_device: bool = True, refuse: bool = True,
         machine=None) -> Plan:
    """All the cheap checks, in order; raises UserError on the first bad input, prefixed with
    where in the config the field it names is written.

    `sync_mode`: the gradient-sync mode (launch passes its --sync); None reads TOOLBOX_SYNC.
    `device_memory` ('128GiB'): plan for that much device memory instead of this rank's free GPU
    memory (`probe_device` False: none, as in launch's parent process, which must not touch the GPU).
    `refuse`: a plan that cannot fit is bad input (finetune --plan shows it instead).
    `machine` (planning.memory.Machine): plan for that GPU machine, not this one (finetune --plan with
    --device-memory or --machine): backend, Liger, precision and the memory as they will be there.
    """
    cfg, base, where = load_located(config, overrides)
    try:
        p = _checks(cfg, base, resume, overwrite, world_size, check_output, fsdp, gpu, import_backend, sync_mode,
                    device_memory, probe_device, refuse, machine)
    except UserError as exc:
        raise UserError(where(str(exc))) from None
    p.locate = where
    return p


def _checks(cfg: TrainConfig, base: Path, resume: bool, overwrite: bool, world_size: int | None,
            check_output: bool, fsdp: bool | None, gpu: bool | None, import_backend: bool,
            sync_mode: str | None, device_memory: str | None = None, probe_device: bool = True,
            refuse: bool = True, machine=None) -> Plan:
    sync_mode = sync_from_env() if sync_mode is None else sync_mode
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
    if cfg.objective != "sft":
        trl_problem(cfg)
    fsdp = using_fsdp() if fsdp is None else fsdp
    gpu = True if machine is not None else gpu_available() if gpu is None else gpu
    backend = pick_backend(cfg, gpu, fsdp, machine)
    if cfg.method in ("qlora", "lora-8bit"):
        if machine is None and (not gpu or importlib.util.find_spec("bitsandbytes") is None):
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
    why = model_files_problem(model_path, cfg)
    if why:
        raise UserError(why)
    tc = text_config(mc)
    max_pos = getattr(tc, "max_position_embeddings", None)
    if max_pos and cfg.data.max_seq_length > max_pos:
        raise UserError(f"data.max_seq_length: {cfg.data.max_seq_length} is above the model's maximum "
                        f"({max_pos}, max_position_embeddings in {model_path})")
    if cfg.train.precision == "auto" and machine is not None:
        precision = "bf16"  # the GPUs the toolbox targets (gfx1151, Hopper) all have it
    elif cfg.train.precision == "auto":
        import torch

        precision = "bf16" if gpu and torch.cuda.is_bf16_supported() else "fp32"
    else:
        precision = cfg.train.precision
    if precision in ("bf16", "fp16") and not gpu:
        raise UserError(f"train.precision: {precision} needs a GPU here; use fp32 or auto on CPU")
    liger = cfg.train.liger
    if liger == "auto":
        # The benchmark: Liger cut peak memory 2.3x and raised tokens/s on the HF path (GPU only).
        # The preference trainers score tokens with TRL's own fused head, which replaces Liger's.
        have = machine.liger if machine is not None else importlib.util.find_spec("liger_kernel") is not None
        liger = backend == "hf" and gpu and cfg.objective == "sft" and have
    elif liger and cfg.objective != "sft":
        raise UserError(f"train.liger: only with objective sft (objective {cfg.objective} scores tokens with "
                        "TRL's fused LM head)")
    elif liger:
        if backend != "hf":
            raise UserError("train.liger: only on backend hf (Unsloth has its own kernels)")
        if machine is None and (not gpu or importlib.util.find_spec("liger_kernel") is None):
            raise UserError("train.liger: true needs the liger-kernel package and a GPU")
    heads.check(cfg, liger)
    aux, router = cfg.train.router_aux_loss_coef, hasattr(tc, "output_router_logits")
    if aux != "auto" and (cfg.objective != "sft" or (aux and not router)):
        raise UserError(f"train.router_aux_loss_coef: {aux}: only for objective sft on a mixture-of-experts model "
                        f"(objective {cfg.objective}; {model_path} has {'a' if router else 'no'} router)")
    tracking.check(cfg.output)  # each tracker's package, before anything is written
    p = Plan(cfg, base, out, model_path, mc, backend, is_multimodal(mc), grad_accum, world, gpu,
             precision, bool(liger), sync=sync_mode)
    if cfg.method != "full":
        from toolbox_train.models.lora import check_adapter

        check_adapter(p)  # MoE experts: what PEFT adapts and refuses, and the adapter's size
    if machine is not None:
        device_memory = device_memory or f"{machine.memory_gib}GiB"
        p.notes.append(f"planned for {machine.describe()}: backend {backend}, liger {bool(liger)}, precision "
                       f"{precision} (what is installed here does not matter)")
    memory_plan(p, fsdp, device_memory, probe_device and gpu and machine is None, refuse,
                unified=bool(machine and machine.unified))
    if p.multimodal and p.memory is not None:  # image tokens and the tower (models/vision.py)
        p.notes.append(vision_note(cfg, mc, model_path, p.memory.shape.extra_params))
    if cfg.train.per_device_batch_size == "auto":  # the plan could not pick one (no shape): the safe choice
        cfg.train.per_device_batch_size = 1
        p.notes.append("train.per_device_batch_size: auto -> 1 (no memory plan for this model)")
    p.grad_accum = batch_plan(cfg, world)
    p.lm_head_kernel, why = heads.pick(cfg, tc, p.liger)
    if cfg.train.lm_head_kernel == "auto" and p.liger:
        p.notes.append(f"train.lm_head_kernel: auto -> {p.lm_head_kernel} ({why})")
    if resume:
        p.resume_from = checkpoints.newest_complete(out / "checkpoints")
        if p.resume_from is None:
            p.notes.append("--resume: no complete checkpoint found, starting from the beginning")
        else:
            from toolbox_train.runs import resume as resume_check

            resume_check.check(p.resume_from, p)  # another model/method/backend/shape: before anything changes
    return p


def lora_target_parameters(p: Plan) -> list[str]:
    """What models/lora.py passes PEFT as target_parameters (none for full fine-tuning)."""
    if p.cfg.method == "full":
        return []
    from toolbox_train.models.lora import lora_target_parameters as experts

    return experts(p)


def memory_plan(p: Plan, fsdp: bool, device_memory: str | None, probe: bool, refuse: bool,
                unified: bool = False) -> None:
    """The memory plan (config.json only, no weights): resolves checkpointing `auto` and
    refuses a run that cannot fit before any weight is loaded (docs/benchmarks.md, Memory planner)."""
    from toolbox_train.planning import memory, strix

    try:
        dev = memory.parse_size(device_memory) if device_memory else (
            memory.device_memory(local_rank=Dist.from_env().local_rank) if probe else None)
    except ValueError as exc:
        raise UserError(f"--device-memory: {exc}") from None
    try:
        unified = unified or probe and memory.unified_memory(Dist.from_env().local_rank)
        tp = memory.plan_training(p.cfg, p.model_config, p.backend, p.liger, p.world_size, fsdp,
                                   p.precision, dev, gpu=p.gpu, unified=unified, lora_params=p.lora_params)
    except (KeyError, TypeError) as exc:  # a config.json without the fields of a decoder
        p.gradient_checkpointing = True if p.cfg.train.gradient_checkpointing == "auto" \
            else p.cfg.train.gradient_checkpointing
        p.notes.append(f"memory plan: not available for this model's config ({exc!r}); checkpointing "
                       f"{p.gradient_checkpointing}")
        return
    p.memory, p.gradient_checkpointing = tp, tp.decision.gradient_checkpointing
    if p.cfg.train.per_device_batch_size == "auto":
        p.cfg.train.per_device_batch_size = tp.setting.batch
        p.notes.append(f"train.per_device_batch_size: auto -> {tp.setting.batch} ({tp.batch_reason})")
    why = strix.memory_refusal(memory.refusal(tp)) if probe and not device_memory else memory.refusal(tp)
    if why and refuse:
        raise UserError(f"memory: {why} (finetune --plan shows the candidates; --device-memory plans for "
                        "another device)")
