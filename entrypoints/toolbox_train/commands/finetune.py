"""`finetune --config train.yaml [--set k=v ...] [--resume] [--overwrite]`.

The objective's TRL trainer (each objective of the registry, objectives/) on either backend: Unsloth (where it
imports and a GPU is present) or plain Hugging Face. Everything that can be wrong with the input is
checked before the model is loaded (exit 2, nothing written).

The script is thin, as TRL's trl/scripts/sft.py is over its SFTConfig and SFTTrainer:
  planning/run.py         the resolvers and the one frozen ResolvedRun (what `launch` imports; nothing heavy)
  planning/preflight.py   every row through the tokenizer, before anything is written
  training/loading.py     the HF / Unsloth model loaders and the PEFT config
  units/registry.py       the objectives found; each objective's unit objectives/<name>/ (hooks, config, trainer)
  training/trainer.py     what every objective's trainer shares (atomic checkpoints, LocalSGD, metrics)"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any, Sequence

import yaml

from toolbox_train.planning import preflight
from toolbox_train.contract import Terminated, UserError, command_parser, run_command
from toolbox_train import disk
from toolbox_train.disk import atomic_write
from toolbox_train.planning.inputs import LAUNCH_DIR, pre_step_leftovers
from toolbox_train.planning.run import FINISHED_ENV, Dist, ResolvedRun, import_backend, log, resolve
from toolbox_train.planning.memory import MACHINES
from toolbox_train.runs.folder import RESOLVED_CONFIG
from toolbox_train.runs import checkpoints
from toolbox_train.commands import finetune_report as report
from toolbox_train.config import tracking
from toolbox_train.config.schema import SOURCE_KEYS
from toolbox_train.units import registry
from toolbox_train.runs.folder import METRICS, SUMMARY


def _trim_metrics(path: Path, upto: int) -> None:
    # Resuming from step k: drop the lines of steps after k that the interrupted run logged.
    if path.exists():
        keep = [ln for ln in path.read_text(errors="replace").splitlines() if (_step_of(ln) or upto + 1) <= upto]
        atomic_write(path, "".join(ln + "\n" for ln in keep))


def _step_of(line: str) -> int | None:
    try:
        step = json.loads(line)["step"]
    except (ValueError, KeyError, TypeError):  # a line cut short by the crash
        return None
    return step if isinstance(step, int) else None


def prepare_output(p: ResolvedRun, resume: bool, overwrite: bool) -> None:
    """Rank 0, after every check: empty the folder (--overwrite) or clear what a run that never
    reached step 1 left; trim the metrics of a resumed run; write config.resolved.yaml."""
    if p.out.exists():
        clear = ([c for c in p.out.iterdir() if c.name != LAUNCH_DIR] if overwrite
                 else [] if resume else pre_step_leftovers(p.out) or [])
        for child in clear:
            disk.remove(child)
    p.out.mkdir(parents=True, exist_ok=True)
    if p.resume_from is not None:
        step = json.loads((p.resume_from / "trainer_state.json").read_text())["global_step"]
        _trim_metrics(p.out / METRICS, step)
        log(f"resuming from {p.resume_from}")
    elif resume:
        _trim_metrics(p.out / METRICS, 0)  # starting over: the lines of the lost steps go
    atomic_write(p.out / RESOLVED_CONFIG, yaml.safe_dump(resolved_document(p), sort_keys=False))


def resolved_document(p: ResolvedRun) -> dict:
    """config.resolved.yaml, from the run: the config in the one form it ran (the objective's own section;
    a single data path's keys or the sources), then `_resolved`, what the resolvers made of it."""
    others = {n for n, u in registry.REGISTRY.items() if u.section} - {p.objective.name}
    data = ("path", *SOURCE_KEYS) if p.cfg.data.sources else ("sources", "stopping_strategy")
    doc = p.cfg.model_copy(update={"model": p.cfg.model.model_copy(update={"path": p.model_path})})
    doc = doc.model_dump(mode="json", exclude={**dict.fromkeys(others, True), "data": set(data)})
    doc["_resolved"] = {"backend": p.backend, "precision": p.precision, "world_size": p.world_size,
                        "gradient_accumulation_steps": p.grad_accum, "liger": p.liger,
                        "lm_head_kernel": p.lm_head_kernel, "data_format": p.data_format, "sync": p.sync,
                        "gradient_checkpointing": p.gradient_checkpointing,
                        "objective": p.objective.name, "reference_model": p.reference, **p.extras}
    if p.cfg.train.per_device_batch_size == "auto":
        doc["_resolved"]["per_device_batch_size"] = p.batch
    if p.lora_target_parameters:  # GPT-OSS's fused experts: adapted through PEFT's target_parameters (models/lora.py)
        doc["_resolved"]["lora_target_parameters"] = list(p.lora_target_parameters)
    if p.memory is not None:
        doc["_resolved"].update(p.memory.resolved)
    return doc


def run(config: dict | str | Path, overrides: Sequence[str] = (), resume: bool = False,
        overwrite: bool = False, device_memory: str | None = None, callbacks: Sequence = ()) -> dict:
    """Fine-tune per `config`; returns the summary (output_dir, steps, tokens_per_s, first/last loss, peak_mem_gib).

    `callbacks`: more TrainerCallbacks (bench's step clocks)."""
    dist = Dist.from_env()
    if int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") or 0) > 0:
        # torchrun restarted the ranks (launch --max-restarts): continue, never start over.
        resume, overwrite = True, False
        log(f"restart {os.environ['TORCHELASTIC_RESTART_COUNT']}: resuming from the newest complete checkpoint")
    # Unsloth (when the run is on it) imported before transformers, TRL and PEFT: it patches them
    p = resolve(config, overrides, resume=resume, overwrite=overwrite, check_output=dist.rank == 0,
                device_memory=device_memory, on_backend=import_backend)
    p, train_ds, eval_ds = preflight.validate(p)  # bad data is still bad input: before the model (the unit's too)
    exports = p.cfg.output.export
    try:
        report.check_exports(exports)
    except UserError as exc:
        raise UserError(p.locate(str(exc))) from None
    for n in p.notes:
        log(n)
    log(f"backend {p.backend}, method {p.cfg.method}, data {p.data_format} ({len(train_ds)} rows), "
        f"precision {p.precision}, world size {p.world_size}, grad accumulation {p.grad_accum}, liger {p.liger}")
    if p.objective.section:
        log(p.objective_line)
    if p.memory is not None:
        log(p.memory.line)
    if dist.rank == 0:
        prepare_output(p, resume, overwrite)

    import transformers

    from toolbox_train.training import loading as models
    from toolbox_train.training.trainer import Metrics, save_final

    transformers.set_seed(p.cfg.train.seed)  # LoRA init and anything random before the Trainer
    model, tok, peft_cfg = models.load(p, dist)
    text_tok = getattr(tok, "tokenizer", tok)  # image rows: a processor, its tokenizer inside
    if text_tok.pad_token is None:
        text_tok.pad_token = text_tok.eos_token

    summary: dict[str, Any] = {"output_dir": str(p.out)}
    callbacks = [Metrics(p.out / METRICS, summary, p.objective.metrics), *callbacks]
    trainer = registry.build(p, dist, model, tok, peft_cfg, train_ds, eval_ds, callbacks)
    args = trainer.args
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
    except Terminated as exc:
        # Checkpoints are written whole or not at all: the newest one resumes exactly.
        cp = checkpoints.newest_complete(Path(trainer.args.output_dir), warn=lambda m: None)
        exc.args = (f"{cp} is the newest checkpoint; `finetune --resume` continues from it" if cp
                    else "no checkpoint had been written; the run starts over",)
        raise
    finally:
        trainer.finish_local_sgd()
        tracking.finish(failed=sys.exc_info()[0] is not None)  # W&B's run files whole before we return
    trainer.check_finite()  # the steps after the last check: no final weights from a NaN run
    save_final(p, trainer, tok)
    summary = summarize(p, trainer, summary)
    if exports and trainer.is_world_process_zero():
        summary["exports"] = [{k: e[k] for k in ("to", "out", "files", "notes")}
                              for e in report.run_exports(p.out, exports)]
        atomic_write(p.out / SUMMARY, json.dumps(summary, indent=2) + "\n")
    return summary


def summarize(p: ResolvedRun, trainer, summary: dict) -> dict:
    """The end-of-run summary (returned, printed by main, summary.json on rank 0)."""
    from toolbox_train.training.trainer import eval_history, objective_span, peak_mem_gib, weights_digest

    if trainer.accelerator.num_processes > 1 and not trainer.is_fsdp_enabled:
        # Every rank must end with the same weights (DDP, or LocalSGD after its last average).
        summary["rank_weight_sha256"] = trainer.accelerator.gather_for_metrics(
            [weights_digest(trainer.accelerator.unwrap_model(trainer.model))], use_gather_object=True)
    if os.environ.get("TOOLBOX_COUNT_GRAD_ALLREDUCE") == "1":
        summary["grad_allreduce_calls"] = trainer.grad_allreduce_calls
    summary["peak_mem_gib"] = round(peak_mem_gib(), 4)
    summary.setdefault("steps", trainer.state.global_step)
    if trainer.is_world_process_zero():
        rows = [json.loads(ln) for ln in (p.out / METRICS).read_text().splitlines() if ln.strip()] \
            if (p.out / METRICS).exists() else []
        if rows:  # the whole run's, a resumed one included
            summary["first_loss"], summary["last_loss"] = rows[0]["loss"], rows[-1]["loss"]
            if p.objective.metrics:  # every one metrics.jsonl kept: DPO's rewards/accuracies, GRPO's reward and kl
                summary["objective"] = {"name": p.objective.name, **objective_span(rows, p.objective.metrics)}
    summary.setdefault("first_loss", None)
    summary.setdefault("last_loss", None)
    if trainer.is_world_process_zero():
        from toolbox_train.export import card  # the model card (README.md) beside the run's adapter or model

        evals = eval_history(trainer)
        summary["eval_loss"] = evals[-1]["eval_loss"] if evals else None
        atomic_write(p.out / SUMMARY, json.dumps(summary, indent=2) + "\n")  # what the card reads
        card.write_run_cards(p.out, p.cfg.method, p.cfg.output.save)
        summary["model_location"] = report.model_location(p.out, p.cfg.method, p.cfg.output.save)
        summary["loss_png"] = report.loss_plot(p.out, rows, evals)
        atomic_write(p.out / SUMMARY, json.dumps(summary, indent=2) + "\n")
    return summary


def show_plan(config, overrides: Sequence[str], device_memory: str | None, world_size: int | None = None,
              fsdp: bool | None = None, machine: str | None = None) -> int:
    """`--plan`: the memory plan on stdout; nothing loaded, nothing written. Exit 0, or 2 if nothing fits.

    With --device-memory or --machine the plan is for that GPU machine (backend, Liger and precision
    as they will run there, whatever is installed here), not for the one it is typed on."""
    from toolbox_train.planning.memory import machine_for, refusal

    try:
        tgt = machine_for(machine, device_memory)
    except ValueError as exc:
        raise UserError(f"--device-memory: {exc}") from None
    p = resolve(config, overrides, check_output=False, device_memory=device_memory, refuse=False,
                world_size=world_size, fsdp=fsdp, machine=tgt)
    if p.notes:
        print("\n".join(p.notes))
    if p.memory is None:
        return 0
    print(p.memory.table)
    print(p.memory.banner())
    why = refusal(p.memory)
    if why:
        print(f"refused: {why}")
        return 2
    return 0


def build_parser() -> argparse.ArgumentParser:
    ap = command_parser("finetune", "Fine-tune a causal LM per a train.yaml.")
    ap.add_argument("--config", required=True, help="train.yaml")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="override a config field, e.g. train.learning_rate=1e-4 (repeatable)")
    ap.add_argument("--resume", action="store_true", help="continue from the newest complete checkpoint")
    ap.add_argument("--overwrite", action="store_true", help="empty a non-empty output folder first")
    ap.add_argument("--plan", action="store_true", help="print the memory plan (candidate settings, predicted "
                    "peak per device, which fit, which would be picked) from config.json alone, and exit")
    ap.add_argument("--device-memory", metavar="SIZE", help="plan for this much device memory (e.g. 128GiB "
                    "for a Strix Halo) instead of this GPU's free memory")
    ap.add_argument("--machine", choices=sorted(MACHINES), help="with --plan: plan for this machine (its memory; "
                    "backend, Liger and precision as they will run there), not the one this runs on")
    # --machine's first name, still taken; `--target` elsewhere is a Dockerfile stage (toolbox build)
    ap.add_argument("--target", dest="machine", choices=sorted(MACHINES), help=argparse.SUPPRESS)
    ap.add_argument("--json", action="store_true", help="print the summary as one JSON line on stdout "
                    "(default: a short human summary; the same JSON is in OUTPUT/summary.json)")
    return ap


def main(argv: list[str] | None = None) -> int:
    return run_command("finetune", _main, argv)


def _main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    if args.plan:
        return show_plan(args.config, args.set, args.device_memory, machine=args.machine)
    if args.machine:
        flag = "--target" if any(a == "--target" or a.startswith("--target=") for a in argv) else "--machine"
        raise UserError(f"{flag}: only with --plan (a run plans for the machine it runs on)")
    summary = run(args.config, args.set, resume=args.resume, overwrite=args.overwrite,
                  device_memory=args.device_memory)
    shutdown_distributed()
    if Dist.from_env().rank == 0:
        print(json.dumps(summary) if args.json else report.human(summary))
    if os.environ.get("LOCAL_RANK", "0") == "0":
        # `toolbox cluster launch` reads this: a node that exits non-zero after it lost nothing.
        print(f"finetune: node {os.environ.get('GROUP_RANK', '0')} finished: {summary.get('steps')} steps",
              file=sys.stderr, flush=True)
        if os.environ.get(FINISHED_ENV):
            atomic_write(Path(os.environ[FINISHED_ENV]), json.dumps({"steps": summary.get("steps")}) + "\n")
    return 0


def shutdown_distributed() -> None:
    """Leave the process group on every rank, while the interpreter is whole.

    Left to interpreter exit, gloo's worker threads may release their last work (tensors that
    hold Python objects) once finalization has begun; CPython then ends such a thread with
    pthread_exit, whose unwinding through a noexcept destructor calls std::terminate: "terminate
    called without an active exception", SIGABRT, after the run had finished."""
    import torch.distributed as td

    if td.is_available() and td.is_initialized():
        td.barrier()
        td.destroy_process_group()


if __name__ == "__main__":
    raise SystemExit(main())
