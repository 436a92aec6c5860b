"""Resolving a run before any weight is loaded (one frozen ResolvedRun, every check passed): nothing
here imports torch, TRL or transformers at import time (launch resolves the run in its own process
before any rank starts); preflight and the model-config check import transformers inside their functions.

  run          the resolvers and the one frozen ResolvedRun they make (backend, precision, memory and batch,
               LM head, resume, objective, outputs)
  inputs       the inputs that need more than the file: output folder, model folder and weights, TRL
  heads        the LM head SFT's loss runs on (train.lm_head_kernel)
  memory       the memory plan: what fits, `gradient_checkpointing: auto`, refusals, the `--plan` table
  preflight    every row through the tokenizer (chat templates, completion lengths)
  reward_config  a reward entry as train.yaml writes it (the objectives that score completions share it)
  rewards      reward functions: resolved and tried on a few rows
  tools        tools and environment classes a model calls while it generates, and the chat template's
               tool format, checked before the model loads
  strix        gfx1151's defaults and refusals (data loader, attention, unified memory)
(The sampler, which the sampling objectives share, is its own package: toolbox_train.generation.)
"""
