"""Training: what every objective's trainer shares, and the model it trains.

  loading      the HF / Unsloth model loaders and the PEFT config
  arguments    the TrainingArguments every objective shares
  trainer      the Toolbox mixin (atomic checkpoints, LocalSGD, test hooks), metrics, the final save
  step_metrics  per-step metrics without a host sync per step (entropy/accuracy: off by default)
"""
