"""Benchmark harness: a matrix of `finetune` configurations and bare reference loops on one GPU.

`bench run` builds each model shape locally from a config (random init, no hub), writes a
word-level tokenizer and a text dataset beside it, then runs every row of the matrix in its own
subprocess (Unsloth and Liger patch transformers at import time, so rows must not share a
process; a crash or OOM of one row is recorded and the rest go on). It writes results.json
after every row, then results.md (table, targets, memory scaling) and chart.png.

Rows:
  bare      the model + optimizer + a plain loop, no Trainer (per backend: hf, unsloth)
  trl       TRL's SFTTrainer with HF + PEFT run directly (what a user would otherwise run)
  finetune  toolbox_train.commands.finetune.run() with backend/method set
  launch    `launch --strategy fsdp --nproc 1 -- finetune ...`
  memscale  LoRA at batch 1, growing sequence length until OOM (the longest that fits)
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Sequence

from toolbox_train.contract import command_parser, run_command
from toolbox_train.disk import atomic_write
from toolbox_train.bench.orchestrate import run_matrix
from toolbox_train.bench.report import merge, render_table, write_report
from toolbox_train.bench.host import VARIANTS
from toolbox_train.bench.rows import worker
from toolbox_train.bench.shapes import BenchError, SHAPES
from toolbox_train.bench.suites import SUITES, build_matrix, select_rows


def build_parser(p: argparse.ArgumentParser | None = None) -> argparse.ArgumentParser:
    if p is None:
        p = command_parser("bench", __doc__.splitlines()[0])
    sub = p.add_subparsers(dest="bench_cmd", required=True)
    r = sub.add_parser("run", help="run the matrix and write results.json, results.md, chart.png")
    r.add_argument("--shapes", default="llama-1b", help=f"comma-separated, of: {', '.join(SHAPES)}")
    r.add_argument("--suite", default="default", choices=list(SUITES))
    r.add_argument("--rows", action="append", default=[], help="glob over row ids (repeatable)")
    r.add_argument("--out", type=Path, default=Path("bench-out"))
    r.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    r.add_argument("--seq", type=int, default=2048)
    r.add_argument("--batch", type=int, default=8)
    r.add_argument("--warmup", type=int, default=3)
    r.add_argument("--steps", type=int, default=10)
    r.add_argument("--peak-tflops", type=float, help="dense bf16 peak of the device (default: by its name)")
    r.add_argument("--row-timeout", type=float, default=600)
    r.add_argument("--workdir", type=Path, help="where models and data are built (default: a temp dir)")
    r.add_argument("--no-chart", action="store_true", help="write results.json and results.md only")
    h = sub.add_parser("host-overhead", help="CPU: finetune's per-step host work against a bare loop, per option")
    h.add_argument("--shape", default="qwen3-0.6b", help="its layer count, at a toy width")
    h.add_argument("--method", default="lora", choices=["lora", "full"])
    h.add_argument("--variants", default=",".join(VARIANTS), help=f"comma-separated, of: {', '.join(VARIANTS)}")
    h.add_argument("--batch", type=int, default=8)
    h.add_argument("--seq", type=int, default=64)
    h.add_argument("--warmup", type=int, default=3)
    h.add_argument("--steps", type=int, default=10)
    h.add_argument("--repeats", type=int, default=3, help="interleaved repeats; the report takes medians")
    h.add_argument("--out", type=Path, default=Path("bench-host"))
    h.add_argument("--workdir", type=Path)
    h.add_argument("--vocab", type=int, help="the toy model's vocabulary (default 512; Qwen3's: 151936)")
    h.add_argument("--fused-head", default="model", choices=["model", "torch"],
                   help="finetune's loss on the CPU: the model's own (default), or TRL's fused-head path with a "
                        "torch kernel, as on a GPU (so output.step_metrics' vocabulary work shows)")
    ls = sub.add_parser("list", help="print the row ids of a suite")
    ls.add_argument("--shapes", default="llama-1b")
    ls.add_argument("--suite", default="default", choices=list(SUITES))
    ls.add_argument("--rows", action="append", default=[])
    rd = sub.add_parser("render", help="merge results.json files and write results.md + chart.png")
    rd.add_argument("results", nargs="+", type=Path)
    rd.add_argument("--out", type=Path, required=True)
    return p


def _shapes(s: str) -> list[str]:
    return [x.strip() for x in s.split(",") if x.strip()]


def dispatch(args: argparse.Namespace) -> int:
    if args.bench_cmd == "list":
        for row in select_rows(build_matrix(_shapes(args.shapes), args.suite), args.rows):
            print(row.id)
        return 0
    if args.bench_cmd == "host-overhead":
        from toolbox_train.bench.host import main_host

        return main_host(args)
    if args.bench_cmd == "render":
        write_report(merge(args.results), args.out)
        print(f"bench: wrote {args.out / 'results.md'} and {args.out / 'chart.png'}")
        return 0
    for name in ("seq", "batch", "steps"):
        if getattr(args, name) < 1:
            raise BenchError(f"--{name}: must be >= 1, got {getattr(args, name)}")
    if args.warmup < 0:
        raise BenchError(f"--warmup: must be >= 0, got {args.warmup}")
    rows = select_rows(build_matrix(_shapes(args.shapes), args.suite), args.rows)
    results = run_matrix(rows, args.out, device=args.device, seq=args.seq, batch=args.batch, warmup=args.warmup,
                         steps=args.steps, peak_tflops=args.peak_tflops, row_timeout=args.row_timeout,
                         workdir=args.workdir, command=" ".join(["bench", *sys.argv[1:]]))
    if args.no_chart:
        atomic_write(args.out / "results.md", render_table(results))
    else:
        write_report(results, args.out)
    print(render_table(results))
    failed = [r["id"] for r in results["rows"] if r.get("status") == "failed"]
    if failed:
        print(f"bench: {len(failed)} row(s) failed: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["_row"]:  # one row's worker process: its log keeps the traceback of a failed row
        return worker(argv[1], argv[2])
    return run_command("bench", lambda argv: dispatch(build_parser().parse_args(argv)), argv)
