"""The TrainingArguments every objective shares (SFT's and the preference objectives'): a
resolved run (planning.run.ResolvedRun) mapped onto transformers' names; `trl_config` makes an
objective's TRL config of them, the sequence length and its own section (objectives/<name>/config.py)."""

from __future__ import annotations

import dataclasses
import os

from toolbox_train.config.tracking import training_args as tracking_args
from toolbox_train.data.images import FORMAT as VISION_FORMAT
from toolbox_train.planning import strix
from toolbox_train.planning.run import Dist, ResolvedRun, using_fsdp


def common_args(p: ResolvedRun, dist: Dist) -> dict:
    """The TrainingArguments every objective shares (SFT's and the preference trainers')."""
    c, t, o = p.cfg, p.cfg.train, p.cfg.output
    gc = p.gradient_checkpointing  # resolved by the memory plan
    # Unsloth sets up its own (offloaded) checkpointing; under FSDP the accelerate config's
    # fsdp_activation_checkpointing does it (transformers refuses both at once).
    hf_gc = bool(gc) and p.backend == "hf" and not using_fsdp()
    # auto: none, unpinned on gfx1151; more for image rows elsewhere
    workers, pin_memory = strix.loader(c.data.loader_workers, p.gpu, images=p.data_format == VISION_FORMAT)
    has_eval = c.data.has_eval()
    return dict(
        output_dir=str(p.out / "checkpoints"),
        per_device_train_batch_size=p.batch,  # train.per_device_batch_size, `auto` resolved
        per_device_eval_batch_size=p.batch,
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
        # transformers' NaN/Inf check of every step's loss reads it to the host each step; the trainer's
        # own check (trainer.check_finite) runs at log steps
        logging_nan_inf_filter=o.nan_inf_filter,
        save_strategy="steps" if o.save_steps else "no",
        save_steps=o.save_steps or 500,
        save_total_limit=None,  # rotation is ours, after the rename
        eval_strategy="steps" if has_eval and o.eval_steps else ("epoch" if has_eval else "no"),
        eval_steps=o.eval_steps,
        **tracking_args(o, p.out, p.base),  # report_to, run_name (and trackio's project)
        disable_tqdm=not o.progress_bar or dist.rank != 0,
        gradient_checkpointing=hf_gc,
        gradient_checkpointing_kwargs={"use_reentrant": False} if hf_gc else None,
        ddp_find_unused_parameters=False,
        include_num_input_tokens_seen="non_padding",
        # one worker collates the next batch while the device trains (docs/benchmarks.md, issue 26: ~9 ms a
        # step of host time on qwen3-0.6b, batch 8 x 2048, that the GPU otherwise waits for)
        dataloader_num_workers=workers,
        dataloader_persistent_workers=workers > 0,
        dataloader_pin_memory=pin_memory,
        # the batch's copy to the GPU from pinned memory without a host sync, as the bare loops copy: accelerate's
        # default copy blocks once per tensor of the batch (five for image rows; issue 44's H100 profile of Gemma 3)
        accelerator_config={"non_blocking": pin_memory},
        save_only_model=False,
        save_on_each_node=dist.world_size > int(os.environ.get("LOCAL_WORLD_SIZE", dist.world_size)),
        restore_callback_states_from_checkpoint=False,
    )


def trl_config(cls, p, dist, **section):
    """`cls` (TRL's DPOConfig, ...) from the shared arguments, the sequence length and the
    objective's own section; arguments this TRL's config does not have are left out."""
    kw = {**common_args(p, dist), "max_length": p.cfg.data.max_seq_length, **section}
    fields = {f.name for f in dataclasses.fields(cls)}
    return cls(**{k: v for k, v in kw.items() if k in fields})
