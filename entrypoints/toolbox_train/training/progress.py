"""Per-step lines on stderr as a person reads them, in place of transformers' dicts on stdout (stdout
keeps finetune's summary alone); every Toolbox trainer installs them when it is built."""

from __future__ import annotations

import sys


def _fmt_logs(state, logs: dict) -> str:
    parts = [f"step {state.global_step}/{state.max_steps}"]
    for k, label, fmt in (("loss", "loss", ".4f"), ("eval_loss", "eval loss", ".4f"),
                          ("grad_norm", "grad norm", ".3g"), ("learning_rate", "lr", ".3g")):
        if isinstance(logs.get(k), (int, float)):
            parts.append(f"{label} {logs[k]:{fmt}}")
    return "finetune: " + "  ".join(parts)


def step_lines(trainer) -> None:
    """Replace transformers' per-step dict printing (stdout) with one line per log on stderr."""
    from transformers.trainer_callback import PrinterCallback, ProgressCallback

    class StepProgress(ProgressCallback):
        def on_log(self, args, state, control, logs=None, **kw):
            if state.is_world_process_zero and logs and self.training_bar is not None:
                self.training_bar.write(_fmt_logs(state, logs), file=sys.stderr)
            elif state.is_world_process_zero and logs:
                print(_fmt_logs(state, logs), file=sys.stderr, flush=True)

    class StepPrinter(PrinterCallback):
        def on_log(self, args, state, control, logs=None, **kw):
            if state.is_world_process_zero and logs:
                print(_fmt_logs(state, logs), file=sys.stderr, flush=True)

    if trainer.pop_callback(ProgressCallback) is not None:
        trainer.add_callback(StepProgress)
    if trainer.pop_callback(PrinterCallback) is not None:
        trainer.add_callback(StepPrinter)
