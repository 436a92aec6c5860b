"""The end of a finetune run as a person reads it: per-step lines on stderr (not transformers'
dicts on stdout), a short summary, loss.png beside metrics.jsonl, and `output.export` run last."""

from __future__ import annotations

import io
import shlex
import sys
from pathlib import Path

from toolbox_train.disk import atomic_write
from toolbox_train.runs.folder import METRICS, SUMMARY, human_size


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


def eval_history(trainer) -> list[dict]:
    return [{"step": h["step"], "eval_loss": float(h["eval_loss"])}
            for h in trainer.state.log_history if "eval_loss" in h]


def loss_plot(out: Path, rows: list[dict], evals: list[dict]) -> str | None:
    """loss.png (train and eval loss per step); None and a note when matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    fig, ax = plt.subplots(figsize=(7, 4), dpi=100)
    ax.plot([r["step"] for r in rows], [r["loss"] for r in rows], label="train loss")
    if evals:
        ax.plot([e["step"] for e in evals], [e["eval_loss"] for e in evals], "o-", label="eval loss")
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("loss")
    ax.set_title(out.name)
    ax.grid(alpha=0.3)
    ax.legend()
    png = io.BytesIO()
    fig.savefig(png, format="png", bbox_inches="tight")
    plt.close(fig)
    atomic_write(out / "loss.png", png.getvalue())
    return str(out / "loss.png")


def model_location(out: Path, method: str, save: str) -> str:
    if method == "full" or save == "merged":
        return f"{out} (full model, safetensors)"
    where = f"{out} (LoRA adapter)"
    return where + (f"; merged model in {out / 'merged'}" if save == "both" else "")


HUMAN_METRICS = ("rewards/accuracies", "rewards/margins", "kl", "reward", "accuracy", "margin")


def human(s: dict) -> str:
    fl, ll = s.get("first_loss"), s.get("last_loss")
    lines = [
        "finetune: done",
        f"  steps        {s.get('steps')}   tokens {s.get('tokens', 0):,}   wall time {s.get('wall_s', 0):.1f} s"
        f"   {s.get('tokens_per_s', 0):,.0f} tokens/s",
        f"  peak memory  {s.get('peak_mem_gib', 0):.2f} GiB",
        f"  loss         {fl:.4f} -> {ll:.4f}" if fl is not None and ll is not None else "  loss         n/a",
    ]
    if s.get("eval_loss") is not None:
        lines.append(f"  eval loss    {s['eval_loss']:.4f}")
    obj = s.get("objective") or {}
    shown = [f"{k} {v['first']:.3g} -> {v['last']:.3g}" for k, v in obj.items() if k in HUMAN_METRICS]
    if shown:
        lines.append(f"  {obj['name']:<12} " + ", ".join(shown))
    lines.append(f"  model        {s.get('model_location', s['output_dir'])}")
    lines.append(f"  files        {METRICS}, {SUMMARY}" + (", loss.png" if s.get("loss_png") else
                                                                   " (no loss.png: matplotlib not installed)"))
    for e in s.get("exports", []):
        lines.append(f"  export       {e['out']} ({human_size(sum(f['bytes'] for f in e['files']))})")
    run = shlex.quote(s["output_dir"])
    if not s.get("exports"):
        lines.append(f"  next         export-model --run {run} --to gguf --quant q8_0,q4_k_m")
    lines.append(f"  then         evaluate --run {run}")
    return "\n".join(lines)


def parse_exports(specs: list[str]) -> list[list[str]]:
    """`output.export` items -> export argument lists: `merged`, `gguf` or `gguf:q8_0,q4_k_m`
    (`+ollama` appended adds the Modelfile). Raises UserError on a bad item."""
    from toolbox_train.contract import UserError
    from toolbox_train.export.llamacpp import parse_quants

    out = []
    for i, spec in enumerate(specs):
        body, _, flag = spec.partition("+")
        to, _, quants = body.partition(":")
        if to not in ("merged", "gguf") or flag not in ("", "ollama") or (to == "merged" and (quants or flag)):
            raise UserError(f"output.export[{i}]: {spec!r}: expected merged, gguf, gguf:TYPES or gguf:TYPES+ollama")
        argv = ["--to", to]
        if to == "gguf":
            try:
                argv += ["--quant", ",".join(parse_quants(quants or "f16"))]
            except UserError as exc:
                raise UserError(f"output.export[{i}]: {exc}") from None
            if flag:
                argv.append("--ollama")
        out.append(argv)
    return out


def run_exports(out: Path, specs: list[list[str]]) -> list[dict]:
    from toolbox_train.export import model as export_model

    done = []
    for argv in specs:
        print(f"finetune: output.export: export-model --run {out} {' '.join(argv)}", file=sys.stderr, flush=True)
        done.append(export_model.run(["--run", str(out), "--overwrite", *argv]))
    return done
