"""What the image ships for training: `finetune`, `launch`, `export-model`, `evaluate`, `bench`,
`rccl-check`.

Kept apart from the `toolbox` package (the image builder) so the image needs nothing of the
builder to train. One package a job:
  cli.py        the one CLI contract of the training commands (errors, --debug, the guard)
  files.py, safe_yaml.py   shared helpers (atomic writes; the bounded YAML reader the host uses too)
  training/     config, data, models, trainer, checkpoints, run summary; `finetune`
  planning/     input checks, memory arithmetic, decisions, calibration (no torch at import)
  export/       `export-model`, `evaluate`, llama.cpp
  distributed/  `launch`, rdma, sync
  checks/       doctor, preflight, `rccl-check`
  bench/        the benchmark harness, `bench`
"""
