"""Training: what every objective's trainer shares, and the model it trains.

  loading      the HF / Unsloth model loaders and the PEFT config
  arguments    the TrainingArguments every objective shares, and an objective's TRL config of them
  preference   what the preference trainers share (paired token counts, the trainer class with the mixin)
  logprob      the CPU stand-in for TRL's fused LM head
  progress     the per-step lines on stderr
  trainer      the Toolbox mixin (atomic checkpoints, LocalSGD, test hooks), metrics, the final save
  step_metrics  per-step metrics without a host sync per step (entropy/accuracy: off by default)
"""
