"""The resolved run: what a fine-tuning run is, once every check that needs no weights has passed.

Small resolvers, each owning its fields and its checks (objective, outputs, backend, precision,
Liger and the LM head, the model, memory and batch, resume; on this rank's own GPU the Strix Halo
checks, planning/strix.py), produce one frozen `ResolvedRun` from
the parsed config, which stays as it was written: the trainer, `launch`, the report, the trackers
and config.resolved.yaml read the run. Everything that can be wrong with the input is found here,
before a model is loaded or a file is written (UserError: exit 2). `launch` resolves the run for
the world size it will start, so this module imports nothing heavy at import time: no trainer, no
TRL, no torch.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, Callable, Mapping, Sequence

from toolbox_train.config import tracking
from toolbox_train.config.schema import TrainConfig, load_located
from toolbox_train.config.sync import DEFAULT as SYNC_DEFAULT, from_env as sync_from_env
from toolbox_train.contract import UserError
from toolbox_train.data import images
from toolbox_train.units import registry
from toolbox_train.units.objective import REFERENCE_TEXT, Context, Objective
from toolbox_train.models.vision import budget as vision_budget, patches_per_image, plan_note as vision_note
from toolbox_train.planning import heads, strix
from toolbox_train.planning.inputs import (config_has_vision, gpu_available, is_multimodal, load_model_config,
                                           model_files_problem, output_problem, resolve_model, text_config, trl_problem)
from toolbox_train.runs import checkpoints

# A file `launch` names in this variable; finetune writes it when the node has finished.
FINISHED_ENV = "TOOLBOX_FINISHED_FILE"
FINISHED = "finished"


def log(msg: str) -> None:
    if int(os.environ.get("RANK", "0")) == 0:
        print(f"finetune: {msg}", file=sys.stderr, flush=True)


@dataclass(frozen=True)
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


@dataclass(frozen=True)
class ResolvedRun:
    """What the resolvers made of the config: everything needed to train, nothing heavy loaded. Frozen:
    a later step that learns more (the data format) makes a new one (dataclasses.replace)."""

    cfg: TrainConfig  # as written (frozen too); what was `auto` in it is resolved in the fields below
    base: Path  # the config's folder: relative paths in it start here
    objective: Objective  # the unit of cfg.objective (units.registry.REGISTRY)
    reference: str  # the reference model: none, adapter or copy
    objective_line: str  # the banner's line of the objective, its section and the reference model
    seq_tokens: int  # the tokens its loss reads a sequence (data.max_seq_length, a generated completion added)
    out: Path
    model_path: str
    model_config: Any
    backend: str
    multimodal: bool
    world_size: int
    gpu: bool
    precision: str
    liger: bool
    batch: int  # the per-device batch (train.per_device_batch_size, `auto` resolved)
    grad_accum: int
    gradient_checkpointing: bool | str = True  # resolved (train.gradient_checkpointing: auto)
    lm_head_kernel: str = "trl"  # resolved (train.lm_head_kernel: auto; planning/heads.py)
    memory: Any = None  # planning.memory.MemoryPlan: the memory plan and why checkpointing is what it is
    sync: str = SYNC_DEFAULT  # every-step or local-sgd:K (see sync.py)
    lora_params: int | None = None  # the adapter's size as PEFT built it (meta device), where the planner's arithmetic falls short
    lora_target_parameters: tuple[str, ...] = ()  # GPT-OSS's fused experts (models/lora.py)
    resume_from: Path | None = None
    data_format: str | None = None  # the rows' format, once preflight has read them
    extras: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))  # the unit's resolve hook's (frozen)
    # what the unit's prepare hook gave its trainer (preflight, once: reward functions); not compared, not written
    inputs: Any = field(default=None, repr=False, compare=False)
    notes: tuple[str, ...] = ()
    # A later check's message on a config field, prefixed with where the field is written.
    locate: Callable[[str], str] = field(default=lambda message: message, repr=False, compare=False)


def pick_backend(cfg: TrainConfig, gpu: bool, fsdp: bool, machine=None, vision: bool = False) -> str:
    # Planning for another machine (`machine`): the toolbox image there has Unsloth, whatever is installed here.
    have_unsloth = machine is not None or importlib.util.find_spec("unsloth") is not None
    unit = registry.REGISTRY[cfg.objective]
    if cfg.backend == "unsloth":
        if not unit.unsloth:
            raise UserError(f"backend: unsloth does not train objective {cfg.objective}; use backend: hf or auto")
        if fsdp:
            raise UserError("backend: unsloth does not support FSDP; use `--strategy ddp` or backend: hf")
        if not gpu or not have_unsloth:
            raise UserError("backend: unsloth needs the unsloth package and a GPU "
                            f"(unsloth installed: {have_unsloth}, GPU: {gpu}); use backend: hf or auto")
        return "unsloth"
    if cfg.backend == "auto":
        picked = unit.auto_backend(cfg) if unit.unsloth else "hf"  # the objective's own pick (objectives/<name>/)
        if picked:
            return picked
        # `vision` (a tower in config.json): Unsloth ran image rows at 0.34x/0.37x of hf (docs/benchmarks.md 2026-12-07)
        return "unsloth" if (gpu and have_unsloth and not fsdp and not vision) else "hf"
    return "hf"


def import_backend(backend: str) -> None:
    """Before transformers, TRL or PEFT are imported for training: Unsloth patches them when imported."""
    if backend == "unsloth":
        # docs/benchmarks.md: Unsloth's auto padding-free cost 9% tokens/s (LoRA, H200, full-length
        # rows) and put finetune under the bare Unsloth loop; read when unsloth is imported.
        os.environ.setdefault("UNSLOTH_DISABLE_AUTO_PADDING_FREE", "1")
        import unsloth  # noqa: F401


def batch_plan(cfg: TrainConfig, world: int, batch: int | None = None) -> int:
    """Gradient accumulation steps; `batch`: the per-device batch once `auto` is resolved."""
    t = cfg.train
    per_device = t.per_device_batch_size if batch is None else batch
    if t.batch_size is None:
        return t.gradient_accumulation_steps
    if per_device == "auto":
        return 1  # the memory plan picks the batch, then this is asked again
    per_step = world * per_device
    if t.batch_size % per_step:
        raise UserError(f"train.batch_size: {t.batch_size} is not divisible by world size {world} x "
                        f"train.per_device_batch_size {per_device} = {per_step}")
    return t.batch_size // per_step


def resolve(config, overrides: Sequence[str] = (), resume: bool = False, overwrite: bool = False,
            world_size: int | None = None, check_output: bool = True, fsdp: bool | None = None,
            gpu: bool | None = None, sync_mode: str | None = None, device_memory: str | None = None,
            probe_device: bool = True, refuse: bool = True, machine=None,
            on_backend: Callable[[str], None] | None = None) -> ResolvedRun:
    """The run of `config`: every cheap check, in order; raises UserError on the first bad input,
    prefixed with where in the config the field it names is written.

    `sync_mode`: the gradient-sync mode (launch passes its --sync); None reads TOOLBOX_SYNC.
    `device_memory` ('128GiB'): plan for that much device memory instead of this rank's free GPU
    memory (`probe_device` False: none, as in launch's parent process, which must not touch the GPU).
    `refuse`: a memory plan that cannot fit is bad input (finetune --plan shows it instead).
    `machine` (planning.memory.Machine): resolve for that GPU machine, not this one (finetune --plan with
    --device-memory or --machine): backend, Liger, precision and the memory as they will be there.
    `on_backend(backend)`: called once the backend is known, before transformers is imported (finetune
    imports Unsloth there: import_backend); the resolvers themselves import no backend.
    """
    cfg, base, where = load_located(config, overrides)
    try:
        run = _resolve(cfg, base, resume, overwrite, world_size, check_output, fsdp, gpu, sync_mode,
                       device_memory, probe_device, refuse, machine, on_backend)
    except UserError as exc:
        raise UserError(where(str(exc))) from None
    return dataclasses.replace(run, locate=where)


def _resolve(cfg: TrainConfig, base: Path, resume: bool, overwrite: bool, world_size: int | None,
             check_output: bool, fsdp: bool | None, gpu: bool | None, sync_mode: str | None,
             device_memory: str | None, probe_device: bool, refuse: bool, machine, on_backend) -> ResolvedRun:
    if resume and overwrite:
        raise UserError("--resume and --overwrite exclude each other")
    unit, reference, line, seq_tokens = resolve_objective(cfg)
    out = resolve_output(cfg, resume, overwrite, check_output)
    world = world_size or Dist.from_env().world_size
    batch_plan(cfg, world)  # a global batch the ranks cannot share, before anything else is asked
    if unit.needs_trl:
        trl_problem(cfg)
    fsdp = using_fsdp() if fsdp is None else fsdp
    gpu = True if machine is not None else gpu_available() if gpu is None else gpu
    backend = pick_backend(cfg, gpu, fsdp, machine, vision=cfg.backend == "auto" and config_has_vision(cfg, base))
    if on_backend is not None:
        on_backend(backend)  # before transformers is imported (check_trainer_names, the model's config)
    extras = MappingProxyType(dict(unit.resolve(Context(cfg, base, backend, gpu, world, fsdp)) if unit.resolve else {}))
    check_method(cfg, gpu, fsdp, machine)
    check_trainer_names(cfg)
    model_path, mc = resolve_model_config(cfg, base)
    precision = resolve_precision(cfg, gpu, machine)
    liger = resolve_liger(cfg, unit, backend, gpu, machine)
    tc = text_config(mc)
    aux, router = cfg.train.router_aux_loss_coef, hasattr(tc, "output_router_logits")
    if aux != "auto" and (not unit.token_loss or (aux and not router)):
        raise UserError(f"train.router_aux_loss_coef: {aux}: only for objective "
                        f"{registry.named(lambda u: u.token_loss)} on a mixture-of-experts model "
                        f"(objective {cfg.objective}; {model_path} has {'a' if router else 'no'} router)")
    tracking.check(cfg.output)  # each tracker's package, before anything is written
    batch = cfg.train.per_device_batch_size
    run = ResolvedRun(cfg, base, unit, reference, line, seq_tokens, out, model_path, mc, backend, is_multimodal(mc), world, gpu,
                      precision, liger, batch=1 if batch == "auto" else batch, grad_accum=1,
                      sync=sync_from_env() if sync_mode is None else sync_mode, extras=extras)
    notes: list[str] = []
    if cfg.method != "full":
        from toolbox_train.models.lora import check_adapter, lora_target_parameters

        lora_params, more = check_adapter(run)  # MoE experts: what PEFT adapts and refuses, and the adapter's size
        run = dataclasses.replace(run, lora_params=lora_params, lora_target_parameters=tuple(lora_target_parameters(run)))
        notes += more
    if machine is not None:
        device_memory = device_memory or f"{machine.memory_gib}GiB"
        notes.append(f"planned for {machine.describe()}: backend {backend}, liger {liger}, precision "
                     f"{precision} (what is installed here does not matter)")
    probe = probe_device and gpu and machine is None  # this rank's own GPU (not launch's parent, not --machine)
    memory, gc, batch, more = resolve_memory(run, fsdp, device_memory, probe, refuse,
                                             unified=bool(machine and machine.unified))
    notes += more
    if probe:
        strix.preflight(run)  # gfx1151's reports: bf16 flash attention's NaNs, an MoE on a HIP that crashes in it
    if run.multimodal and memory is not None:  # image tokens and the tower (models/vision.py)
        notes.append(vision_note(cfg, mc, model_path, memory.shape.extra_params))
    kernel, why = heads.resolve(cfg, tc, liger, batch, unit.token_loss)
    if cfg.train.lm_head_kernel == "auto" and liger:
        notes.append(f"train.lm_head_kernel: auto -> {kernel} ({why})")
    run = dataclasses.replace(run, memory=memory, gradient_checkpointing=gc, batch=batch,
                              grad_accum=batch_plan(cfg, world, batch), lm_head_kernel=kernel)
    resume_from, more = resolve_resume(run, resume)
    return dataclasses.replace(run, resume_from=resume_from, notes=tuple(notes + more))


def resolve_objective(cfg: TrainConfig) -> tuple[Objective, str, str, int]:
    """(the objective's unit, its reference model, the banner's line of them, the tokens its loss reads a
    sequence). The unit's own functions are asked here, once, in its own module's order."""
    unit = registry.REGISTRY[cfg.objective]
    seq_tokens = cfg.data.max_seq_length + unit.extra_tokens(cfg)
    said = unit.describe(getattr(cfg, unit.name).model_dump(mode="json")) if unit.section else {}
    reference = unit.reference(cfg)
    parts = ", ".join(f"{k} {'+'.join(map(str, v)) if isinstance(v, list) else v}" for k, v in said.items()
                      if v is not None)  # loss_type [sigmoid, sft] -> sigmoid+sft, loss_weights -> 1.0+0.5
    return unit, reference, f"objective {unit.name} ({parts}); {REFERENCE_TEXT[reference]}", seq_tokens


def resolve_output(cfg: TrainConfig, resume: bool, overwrite: bool, check: bool) -> Path:
    """output.dir, absolute; with `check` (rank 0), whether the run may write there."""
    out = Path(cfg.output.dir).expanduser()
    out = (out if out.is_absolute() else Path.cwd() / out).resolve()
    why = output_problem(out, resume, overwrite) if check else None
    if why:
        raise UserError(why)
    return out


def check_method(cfg: TrainConfig, gpu: bool, fsdp: bool, machine) -> None:
    if cfg.method in ("qlora", "lora-8bit"):
        if machine is None and (not gpu or importlib.util.find_spec("bitsandbytes") is None):
            raise UserError(f"method: {cfg.method} needs bitsandbytes and a GPU for quantized weights "
                            f"(GPU: {gpu}); use lora or full here")
        if fsdp and cfg.method == "lora-8bit":
            raise UserError("method: lora-8bit does not shard under FSDP; use qlora or lora")


def check_trainer_names(cfg: TrainConfig) -> None:
    from transformers.trainer_utils import SchedulerType
    from transformers.training_args import OptimizerNames

    for fld, value, enum in (("train.optimizer", cfg.train.optimizer, OptimizerNames),
                             ("train.lr_scheduler", cfg.train.lr_scheduler, SchedulerType)):
        names = [e.value for e in enum]
        if value not in names:
            raise UserError(f"{fld}: {value!r} is not one of {', '.join(names)}")


def resolve_model_config(cfg: TrainConfig, base: Path):
    """(model path, its config), the weight files whole and the sequence length within the model's."""
    model_path = resolve_model(cfg, base)
    mc = load_model_config(model_path, cfg)
    why = model_files_problem(model_path, cfg)
    if why:
        raise UserError(why)
    max_pos = getattr(text_config(mc), "max_position_embeddings", None)
    if max_pos and cfg.data.max_seq_length > max_pos:
        raise UserError(f"data.max_seq_length: {cfg.data.max_seq_length} is above the model's maximum "
                        f"({max_pos}, max_position_embeddings in {model_path})")
    return model_path, mc


def resolve_precision(cfg: TrainConfig, gpu: bool, machine) -> str:
    if cfg.train.precision == "auto" and machine is not None:
        precision = "bf16"  # the GPUs the toolbox targets (gfx1151, Hopper) all have it
    elif cfg.train.precision == "auto":
        import torch

        precision = "bf16" if gpu and torch.cuda.is_bf16_supported() else "fp32"
    else:
        precision = cfg.train.precision
    if precision in ("bf16", "fp16") and not gpu:
        raise UserError(f"train.precision: {precision} needs a GPU here; use fp32 or auto on CPU")
    return precision


def resolve_liger(cfg: TrainConfig, unit: Objective, backend: str, gpu: bool, machine) -> bool:
    liger = cfg.train.liger
    if liger == "auto":
        # The benchmark: Liger cut peak memory 2.3x and raised tokens/s on the HF path (GPU only).
        # The preference trainers score tokens with TRL's own fused head, which replaces Liger's.
        have = machine.liger if machine is not None else importlib.util.find_spec("liger_kernel") is not None
        return bool(backend == "hf" and gpu and unit.token_loss and have)
    if liger and not unit.token_loss:
        raise UserError(f"train.liger: only with objective {registry.named(lambda u: u.token_loss)} (objective "
                        f"{cfg.objective} scores tokens with "
                        "TRL's fused LM head)")
    if liger:
        if backend != "hf":
            raise UserError("train.liger: only on backend hf (Unsloth has its own kernels)")
        if machine is None and (not gpu or importlib.util.find_spec("liger_kernel") is None):
            raise UserError("train.liger: true needs the liger-kernel package and a GPU")
    return bool(liger)


def with_data_format(run: ResolvedRun, most_images: int = 0) -> ResolvedRun:
    """A multimodal model's run planned again once preflight has read its rows (`run.data_format` set): the first
    plan (config.json alone) took them for image rows of one image each. Text rows take the fused head and no
    tower; image rows keep the tower's activations for every image of a row where it trains (or Unsloth keeps
    them). Same device, same refusal: rows the plan cannot fit are refused before the model loads."""
    plan = run.memory
    rows = run.data_format == images.FORMAT
    tower_kept = plan is not None and ("vision" in plan.setting.vision_train or plan.setting.backend == "unsloth")
    if plan is None or not run.multimodal or rows and (most_images <= 1 or not tower_kept):
        return run  # the first plan holds
    st = plan.setting
    dev = f"{int(plan.device_bytes)}" if plan.device_bytes else None
    memory, gc, batch, more = resolve_memory(run, st.strategy == "fsdp", dev, False, True, st.unified_memory,
                                             images_per_row=max(1, most_images))
    said = (f"memory plan: the tower's activations at {most_images} images a row (the most a row of the data "
            "holds)" if rows else "memory plan: text rows (the LM head's fused loss, no image through the tower)")
    return dataclasses.replace(run, memory=memory, gradient_checkpointing=gc, batch=batch,
                               grad_accum=batch_plan(run.cfg, run.world_size, batch),
                               notes=run.notes + (said, *more))


def resolve_memory(run: ResolvedRun, fsdp: bool, device_memory: str | None, probe: bool, refuse: bool,
                   unified: bool = False, images_per_row: int = 1):
    """The memory plan (config.json only, no weights): (plan or None, checkpointing, per-device batch, notes).
    Resolves checkpointing and the batch `auto` and refuses a run that cannot fit before any weight is
    loaded (docs/benchmarks.md, Memory planner). `images_per_row`: the most images a row holds, once
    preflight knows (with_data_format)."""
    from toolbox_train.planning import memory

    t = run.cfg.train
    # a multimodal model's rows are planned as image rows until preflight has read them (with_data_format)
    image_rows = run.multimodal and run.data_format in (None, images.FORMAT)
    try:
        dev = memory.parse_size(device_memory) if device_memory else (
            memory.device_memory(local_rank=Dist.from_env().local_rank) if probe else None)
    except ValueError as exc:
        raise UserError(f"--device-memory: {exc}") from None
    try:
        unified = unified or probe and memory.unified_memory(Dist.from_env().local_rank)
        tp = memory.plan_training(run.cfg, run.model_config, run.backend, run.liger, run.world_size, fsdp,
                                   run.precision, dev, gpu=run.gpu, unified=unified, lora_params=run.lora_params,
                                   unit=run.objective, reference=run.reference, seq=run.seq_tokens,
                                   extras=dict(run.extras),
                                   image_rows=image_rows,
                                   patches_per_image=images_per_row * patches_per_image(
                                       run.model_config, run.model_path, vision_budget(run.cfg)) if image_rows else 0)
    except (KeyError, TypeError) as exc:  # a config.json without the fields of a decoder
        gc = True if t.gradient_checkpointing == "auto" else t.gradient_checkpointing
        notes = [f"memory plan: not available for this model's config ({exc!r}); checkpointing {gc}"]
        if t.per_device_batch_size == "auto":  # no shape to pick one by: the safe choice
            notes.append("train.per_device_batch_size: auto -> 1 (no memory plan for this model)")
        return None, gc, 1 if t.per_device_batch_size == "auto" else t.per_device_batch_size, notes
    notes = []
    if t.per_device_batch_size == "auto":
        notes.append(f"train.per_device_batch_size: auto -> {tp.setting.batch} ({tp.batch_reason})")
    why = memory.refusal(tp)
    if probe and not device_memory:  # torch sees half the machine on a Strix Halo at the TTM default: say so
        why = strix.memory_refusal(why)
    if why and refuse:
        raise UserError(f"memory: {why} (finetune --plan shows the candidates; --device-memory plans for "
                        "another device)")
    # the memory plan's batch counts sequences (DPO's chosen and rejected: 2 a row); the run's is rows
    batch = tp.setting.batch if t.per_device_batch_size == "auto" else t.per_device_batch_size
    return tp, tp.decision.gradient_checkpointing, batch, notes


def resolve_resume(run: ResolvedRun, resume: bool) -> tuple[Path | None, list[str]]:
    """--resume: the newest complete checkpoint, checked against this run (another model, method,
    backend or shape is refused before anything changes)."""
    if not resume:
        return None, []
    cp = checkpoints.newest_complete(run.out / "checkpoints")
    if cp is None:
        return None, ["--resume: no complete checkpoint found, starting from the beginning"]
    from toolbox_train.runs import resume as resume_check

    resume_check.check(cp, run)
    return cp, []
