"""What every objective's trainer shares: the Toolbox mixin (atomic checkpoints, LocalSGD, the test
hooks), the metrics callback, the final save. Each objective's trainer (objectives/<name>/trainer.py)
puts the mixin on TRL's trainer. Imported only once the checks have passed (transformers and torch
are heavy; Unsloth, when used, must be imported before them: finetune does, planning.run.import_backend).
"""

from __future__ import annotations

import fnmatch
import json
import os
import shutil
import signal
import time
from pathlib import Path

from transformers import TrainerCallback

from toolbox_train.runs import checkpoints
from toolbox_train.runs import resume
from toolbox_train import disk
from toolbox_train.training import progress
from toolbox_train.contract import ToolError
from toolbox_train.models.arithmetic import GiB
from toolbox_train.planning.run import ResolvedRun, log
from toolbox_train.config.sync import local_sgd_steps

LOCAL_SGD_STATE = "local_sgd.json"  # in each checkpoint: LocalSGD's step counter


def peak_mem_gib() -> float:
    import torch

    if torch.cuda.is_available():
        return torch.cuda.max_memory_allocated() / GiB
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB on Linux


def is_kept(key: str, metrics: tuple[str, ...]) -> bool:
    """`key` (a name TRL logs) is one of the objective's `metrics` (names, or families such as `tools/*`)."""
    return any(fnmatch.fnmatchcase(key, m) for m in metrics)


def objective_span(rows: list[dict], metrics: tuple[str, ...]) -> dict:
    """{metric: {first, last}} of every one of `metrics` that any row of metrics.jsonl has: the first and
    last rows that have it (a metric logged on some steps only, as KTO's rewards/chosen, still counts)."""
    out: dict = {}
    for row in rows:
        for k, v in row.items():
            if is_kept(k, metrics):
                out.setdefault(k, {"first": v})["last"] = v
    return out


class Metrics(TrainerCallback):
    """One JSON line per logged optimizer step (rank 0) into metrics.jsonl, plus what the summary needs."""

    def __init__(self, path: Path, summary: dict, metrics: tuple[str, ...] = ()):
        self.path, self.summary, self.metrics = path, summary, metrics  # the objective's (TRL's names, families)
        # Test hook: an interruption after step k (the checkpoint of step k is still written).
        self.stop_after = int(os.environ.get("TOOLBOX_STOP_AFTER_STEP", "0") or 0)
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
        for k, v in logs.items():
            if k not in row and isinstance(v, (int, float)) and is_kept(k, self.metrics):
                row[k] = float(v)
        self.t_last, self.tok_last = now, tokens
        with self.path.open("a") as f:
            f.write(json.dumps(row) + "\n")
        self.summary.setdefault("first_loss", row["loss"])
        self.summary["last_loss"] = row["loss"]

    def on_step_end(self, args, state, control, **kw):
        if self.stop_after and state.global_step >= self.stop_after:
            control.should_training_stop = True
        # Test hooks: a weight turned NaN after step k (a diverging run), SIGTERM to itself after step k.
        if state.global_step == int(os.environ.get("TOOLBOX_TEST_POISON_AFTER_STEP", "0") or 0):
            next(kw["model"].parameters()).data.fill_(float("nan"))
        if state.global_step == int(os.environ.get("TOOLBOX_TEST_SIGNAL_AFTER_STEP", "0") or 0):
            _signal_for_test()

    def on_train_end(self, args, state, control, **kw):
        dt = time.perf_counter() - (self.t0 or time.perf_counter())
        self.summary["steps"] = state.global_step
        self.summary["wall_s"] = round(dt, 3)
        self.summary["tokens"] = int(state.num_input_tokens_seen)
        self.summary["tokens_per_s"] = (state.num_input_tokens_seen - (self.tok0 or 0)) / max(dt, 1e-9)


def _signal_for_test() -> None:
    """SIGTERM to this process, or (TOOLBOX_TEST_SIGNAL_TARGET=launch) to `launch`, the parent of
    the torchrun agent that started this rank; then wait for the SIGTERM to come back through it."""
    pid = os.getpid()
    if os.environ.get("TOOLBOX_TEST_SIGNAL_TARGET") == "launch":
        with open(f"/proc/{os.getppid()}/stat") as f:
            pid = int(f.read().rsplit(")", 1)[1].split()[1])
    os.kill(pid, signal.SIGTERM)
    time.sleep(600)  # Terminated is raised in here when the signal arrives


class _LocalSGDStep(TrainerCallback):
    def __init__(self, trainer: "Toolbox"):
        self.trainer = trainer

    def on_step_end(self, args, state, control, **kw):
        self.trainer.optimizer_step_done()


def fused_head_ok(inputs) -> bool:
    from trl.trainer import utils as trl_utils

    ids = inputs.get("input_ids")
    return getattr(trl_utils, "_ChunkedLogProbFunction", None) is not None and (ids is None or ids.is_cuda)


class Toolbox:
    """What every objective's trainer gets on top of TRL's (objectives/<name>/trainer.py): atomic checkpoints (temp name, then rename; keep last K) and LocalSGD.

    `run`: the resolved run (checkpoint rotation, CPU optimizer loading, the sync mode).
    """

    _staging: str | None = None
    _local_sgd = None
    grad_allreduce_calls = 0

    def __init__(self, *args, run: ResolvedRun, **kw):
        self.toolbox_run = run
        self.local_sgd_every = local_sgd_steps(run.sync)
        super().__init__(*args, **kw)
        self.add_callback(_LocalSGDStep(self))
        progress.step_lines(self)  # per-step lines on stderr; stdout keeps the summary alone

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
            if self.is_local_process_zero():
                resume.write_identity(staging / name, self.toolbox_run)  # what --resume checks
            if self._local_sgd is not None and self.is_local_process_zero():
                disk.write_json(staging / name / LOCAL_SGD_STATE,
                                 {"every": self._local_sgd.local_sgd_steps, "num_steps": self._local_sgd.num_steps})
        except BaseException as exc:
            self._failed_save(exc, root, staging, name)
            raise
        finally:
            self._staging = None
        self.accelerator.wait_for_everyone()
        if self.is_local_process_zero() and (staging / name).exists():
            checkpoints.publish(staging / name, root / name)
            try:
                staging.rmdir()
            except OSError:
                pass
            checkpoints.rotate(root, self.toolbox_run.cfg.output.keep_checkpoints)
        self.accelerator.wait_for_everyone()

    def _failed_save(self, exc: BaseException, root: Path, staging: Path, name: str) -> None:
        """A checkpoint that could not be written whole leaves nothing (the newest whole one stays
        the one to resume); a full disk is a fault named by its path, not an internal error."""
        full = disk.disk_full(exc, staging) if isinstance(exc, Exception) else None
        if self.is_local_process_zero():
            shutil.rmtree(staging / name, ignore_errors=True)
            try:
                staging.rmdir()
            except OSError:
                pass
        if full is None:
            return
        cp = checkpoints.newest_complete(root, warn=lambda m: None)
        raise ToolError(f"disk full at {root} while saving {name} ({full}); the partial copy is removed, "
                        + (f"{cp} is the newest whole checkpoint: free space, then `finetune --resume` continues "
                           "from it" if cp else "no whole checkpoint had been written")) from exc

    def _count_allreduces(self, model):
        # Test hook (TOOLBOX_COUNT_GRAD_ALLREDUCE=1): DDP's own all-reduce, counted per bucket.
        from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

        def hook(state, bucket):
            self.grad_allreduce_calls += 1
            return allreduce_hook(state, bucket)

        model.register_comm_hook(None, hook)

    _nonfinite = None  # a tensor: how many micro-steps' losses were NaN/inf (no sync per step)

    def training_step(self, model, inputs, num_items_in_batch=None):
        loss = self._training_step(model, inputs, num_items_in_batch)
        bad = (~loss.detach().isfinite()).sum()
        self._nonfinite = bad if self._nonfinite is None else self._nonfinite + bad
        return loss

    def _maybe_log_save_evaluate(self, tr_loss, grad_norm, *args, **kw):
        # Before a log, an eval or a checkpoint: a NaN/inf loss (or gradient norm) stops the run
        # here, so no checkpoint of diverged weights is ever written.
        if self.control.should_log or self.control.should_save or self.control.should_evaluate:
            self.check_finite(grad_norm)
        return super()._maybe_log_save_evaluate(tr_loss, grad_norm, *args, **kw)

    def check_finite(self, grad_norm=None) -> None:
        import torch

        bad = self._nonfinite if self._nonfinite is not None else torch.zeros((), device=self.args.device)
        if grad_norm is not None:  # on the device: one read below, not one for the norm and one for the count
            bad = bad + (~torch.as_tensor(grad_norm, device=bad.device).isfinite()).to(bad.dtype)
        if self.accelerator.num_processes > 1:  # every rank stops, or none does
            bad = self.accelerator.reduce(bad.to(self.args.device), reduction="sum")
        if int(bad) == 0:
            return
        from toolbox_train.planning.strix import nan_hint

        attn = getattr(getattr(self.model, "config", None), "_attn_implementation", None)
        raise self.stopped(f"the loss became NaN/inf at step {self.state.global_step}",
                           nan_hint(self.state.global_step, attn) or "lower train.learning_rate or set train.max_grad_norm")

    def stopped(self, what: str, hint: str) -> ToolError:
        """The error that stops a run gone bad (a NaN loss, a NaN reward): nothing is written after it."""
        cp = checkpoints.newest_complete(Path(self.args.output_dir), warn=lambda m: None)
        kept = (f"the last good checkpoint is {cp}: `finetune --resume` continues from it" if cp
                else "no checkpoint was written before it")
        return ToolError(f"{what}: training stopped, nothing written after it; {kept} ({hint})")

    def _training_step(self, model, inputs, num_items_in_batch=None):
        if not getattr(self, "_hooked", False):
            self._hooked = True
            if os.environ.get("TOOLBOX_COUNT_GRAD_ALLREDUCE") == "1" and hasattr(model, "register_comm_hook"):
                self._count_allreduces(model)
        ksteps = self.local_sgd_every
        if ksteps and self.accelerator.num_processes > 1:
            if self._local_sgd is None:
                from accelerate.local_sgd import LocalSGD

                self._local_sgd = LocalSGD(self.accelerator, model, ksteps, enabled=True)
                # Resumed: go on counting where the checkpoint's run was, so the averages fall
                # on the steps (and give the weights) of a run never interrupted.
                self._local_sgd.num_steps = self._local_sgd_resumed_steps()
                log(f"LocalSGD: averaging parameters every {ksteps} optimizer steps (no per-step all-reduce)"
                    f", counting from step {self._local_sgd.num_steps}")
            # Per micro-step, so it nests inside the Trainer's own no_sync of accumulation steps
            # (one no_sync held for the whole run is undone when an inner one exits).
            with model.no_sync():
                return super().training_step(model, inputs, num_items_in_batch)
        return super().training_step(model, inputs, num_items_in_batch)

    def _load_optimizer_and_scheduler(self, checkpoint):
        if self.toolbox_run.gpu or checkpoint is None:
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

    def _run_epoch(self, *args, **kwargs):
        # Resumed from a checkpoint of the last step: transformers would still run one more
        # step (it checks for the end only after a step); there is nothing left to train.
        if 0 < self.state.max_steps <= self.state.global_step:
            self.control.should_training_stop = True
            return None
        return super()._run_epoch(*args, **kwargs)

    def _local_sgd_resumed_steps(self) -> int:
        cp = self.toolbox_run.resume_from
        if cp is None:
            return 0
        if (cp / LOCAL_SGD_STATE).is_file():
            return int(json.loads((cp / LOCAL_SGD_STATE).read_text())["num_steps"])
        return self.state.global_step  # a checkpoint from before the counter was saved: one per step

    def optimizer_step_done(self):
        if self._local_sgd is not None:
            self._local_sgd.step()
            if self._local_sgd.num_steps % self._local_sgd.local_sgd_steps == 0:
                log(f"LocalSGD: averaged at step {self.state.global_step}")

    def finish_local_sgd(self):
        if self._local_sgd is not None:
            self._local_sgd._sync_and_avg_model_params()  # the last average, as LocalSGD's __exit__ does
            self._local_sgd = None


def weights_digest(model) -> str:
    import hashlib

    h = hashlib.sha256()
    for name, prm in sorted(model.named_parameters(), key=lambda x: x[0]):
        h.update(name.encode())
        h.update(prm.detach().float().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


def eval_history(trainer) -> list[dict]:
    """Each evaluation of the run: its step and eval loss."""
    return [{"step": h["step"], "eval_loss": float(h["eval_loss"])}
            for h in trainer.state.log_history if "eval_loss" in h]


def save_final(p: ResolvedRun, trainer: Toolbox, tok) -> None:
    """The trained model into the run folder. A save that fails (a full disk: the model is the largest
    file a run writes) leaves none of its files - what the folder held before stays - and a full disk is
    said with the folder and the whole checkpoint that `--resume` saves the model from."""
    zero = trainer.is_world_process_zero()
    before = set(os.listdir(p.out)) if zero else set()
    try:
        _save_final(p, trainer, tok)
    except Exception as exc:
        full = disk.disk_full(exc, p.out)
        if zero:
            for name in set(os.listdir(p.out)) - before:
                disk.remove(p.out / name)
        if full is None:
            raise
        cp = checkpoints.newest_complete(Path(trainer.args.output_dir), warn=lambda m: None)
        raise ToolError(f"disk full at {p.out} while saving the final model ({full}); the files it had written "
                        "are removed, " + (f"{cp} is the newest whole checkpoint: free space, then `finetune "
                                           "--resume` saves the model from it" if cp else
                                           "no whole checkpoint had been written")) from exc


def _save_final(p: ResolvedRun, trainer: Toolbox, tok) -> None:
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
