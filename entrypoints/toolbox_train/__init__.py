"""What the image ships for training: `finetune`, `launch`, `export-model`, `evaluate`, `bench`,
`rccl-check`.

Kept apart from the `toolbox` package (the image builder) so the image needs nothing of the
builder to train. Its folders are layers, each importing only from the ones listed above it
(function-level imports count; tests/train/test_layers.py holds it):
  contract.py, disk.py, guards.py, safe_yaml.py   the base: the one CLI contract (errors, --debug,
                the guard), atomic writes, path checks, the bounded YAML reader
  objectives/   the objective registry and each objective's declaration (objectives/<name>/__init__.py)
  config/       train.yaml's schema and the settings read from the environment
  data/         datasets: load, mix, detect the format, check every row
  models/       model folders, LoRA targets, the memory arithmetic
  runs/         the output folder: its files, checkpoints, resume
  planning/     the checks and the resolved run (ResolvedRun), the memory plan, preflight (no torch at import)
  training/     what every objective's trainer shares; model loading
  objectives/*/ each objective's TRL config and trainer (objectives/<name>/config.py, trainer.py)
  export/       `export-model`, `evaluate`, llama.cpp, the model card
  commands/     `finetune`, `launch` (and Ray Train), `rccl-check`, the in-image health check
  bench/        the benchmark harness, `bench`, and the memory calibration
"""
