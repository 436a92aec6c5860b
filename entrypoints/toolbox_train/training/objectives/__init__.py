"""The preference objectives (DPO, ORPO, KTO, GRPO) on TRL's trainers, beside SFT's training path.

  config     their train.yaml sections (`objective: dpo|orpo|kto|grpo`) and the data format each needs
  pref_rows  their dataset rows in TRL's types, checked before anything heavy runs
  rewards    GRPO's reward functions: built-ins and `module:function`
  generation GRPO's generation: transformers' generate or TRL's vLLM colocate mode, refused where it cannot run
  trainers   each objective's TRL config and trainer, with SFT's checkpoints, resume and LocalSGD
  logprob    the CPU stand-in for TRL 1.15's Triton log-probability kernel
"""
