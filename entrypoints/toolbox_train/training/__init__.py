"""Training: the `finetune` console script and what one run needs, in data-path order.

  config       train.yaml -> TrainConfig (fields, files and lines)
  data, rowcheck   datasets: load, detect the format, check every row
  weights      cheap integrity checks of weight and checkpoint files
  models       the HF / Unsloth model loaders
  lora         the PEFT LoRA config (which modules get adapters)
  sft_config   TrainConfig + Plan -> TRL's SFTConfig
  trainer      the SFTTrainer subclass (atomic checkpoints, LocalSGD, metrics)
  step_metrics  its per-step metrics without a host sync per step (entropy/accuracy: off by default)
  checkpoints  which checkpoint a run resumes from
  resume       whether a checkpoint belongs to this config (finetune --resume)
  runs         what a finished output folder holds (read by export and evaluate)
  report       the end of a run as a person reads it (step lines, summary, loss.png)
  finetune     the console script (thin: checks in planning.checks, the heavy imports on demand)
  objectives/  the preference objectives (DPO, ORPO, KTO, GRPO) on TRL's trainers
"""
