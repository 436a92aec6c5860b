"""Checking and planning a run before any weight is loaded: nothing here imports torch, TRL or
transformers at import time (launch runs the checks in its own process before any rank starts).

  checks       the input checks and the resolved Plan (config, data, model folder, distributed env)
  arithmetic   the memory model: peak device memory of a training setting from config.json alone
  decisions    what fits: `gradient_checkpointing: auto`, refusals, the `--plan` table
  calibration  measuring the arithmetic's constants on a GPU (`python -m toolbox_train.planning.calibration`)
"""
