"""Benchmark harness: a matrix of `finetune` configurations and bare reference loops on one GPU.

One module a job (the `bench` console script and `python -m toolbox_train.bench` run command.main):
  shapes       model shapes, FLOPs per token, MFU          suites       rows and suites
  synthetic    local model, tokenizer and data             measure      what the row workers share
  rows         the row workers (one process each)          environment  versions, device
  orchestrate  run the matrix, results.json per row        report       targets, table, chart, merge
  command      argument parsing and dispatch
  calibration  the memory arithmetic's constants measured on a GPU

Importing the package stays cheap (stdlib only): the host's `toolbox bench` builds its parser here.
"""

from toolbox_train.bench.command import build_parser, dispatch, main
from toolbox_train.bench.measure import CountingCollator, StepTimer, count_tokens, result_from_steps
from toolbox_train.bench.orchestrate import run_matrix
from toolbox_train.bench.report import merge, render_chart, render_table, targets, write_report
from toolbox_train.bench.rows import finetune_config, steps_from_metrics, worker
from toolbox_train.bench.shapes import SHAPES, BenchError, flops_per_token, matmul_params, mfu, peak_flops
from toolbox_train.bench.suites import SUITES, Row, build_matrix, select_rows
from toolbox_train.bench.synthetic import build_model_dir, build_tokenizer, read_token_batches, write_text_dataset

__all__ = [
    "SHAPES", "SUITES", "BenchError", "CountingCollator", "Row", "StepTimer", "build_matrix", "build_model_dir",
    "build_parser", "build_tokenizer", "count_tokens", "dispatch", "finetune_config", "flops_per_token", "main",
    "matmul_params", "merge", "mfu", "peak_flops", "read_token_batches", "render_chart", "render_table",
    "result_from_steps", "run_matrix", "select_rows", "steps_from_metrics", "targets", "worker",
    "write_report", "write_text_dataset",
]
