"""The end of a finetune run as a person reads it: a short summary, loss.png beside metrics.jsonl, and
`output.export` run last (the per-step lines on stderr are the trainer's: training/progress.py)."""

from __future__ import annotations

import io
import shlex
import sys
from pathlib import Path

from toolbox_train.disk import atomic_write
from toolbox_train.runs.folder import METRICS, SUMMARY
from toolbox_train.sizes import human_size


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


def check_exports(exports) -> None:
    """`output.export` (config.schema.ExportCfg items), before training: the GGUF types export-model
    takes, and llama.cpp's tools there (not found after hours of training)."""
    from toolbox_train.contract import UserError
    from toolbox_train.export.llamacpp import find_tools, parse_quants

    for i, e in enumerate(exports):
        if e.to == "gguf" and e.quants:
            try:
                parse_quants(",".join(e.quants))
            except UserError as exc:
                raise UserError(f"output.export.{i}: {exc}") from None
    if any(e.to == "gguf" for e in exports):
        find_tools(None)


def run_exports(out: Path, exports) -> list[dict]:
    """Each `output.export` item through export-model, typed (no command line in between)."""
    from toolbox_train.export import model as export_model

    done = []
    for e in exports:
        quant = ",".join(e.quants) or None
        say = f"--to {e.to}" + (f" --quant {quant}" if quant else "") + (" --ollama" if e.ollama else "")
        print(f"finetune: output.export: export-model --run {out} {say}", file=sys.stderr, flush=True)
        done.append(export_model.export(export_model.Request(str(out), e.to, quant, e.ollama, overwrite=True)))
    return done
