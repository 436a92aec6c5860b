"""Checking and planning a run before any weight is loaded: nothing here imports torch, TRL or
transformers at import time (launch runs the checks in its own process before any rank starts);
preflight and the model-config check import transformers inside their functions.

  plan         the input checks and the resolved Plan (config, data, model folder, distributed env)
  memory       the memory plan: what fits, `gradient_checkpointing: auto`, refusals, the `--plan` table
  preflight    every row through the tokenizer (chat templates, completion lengths)
  rewards      GRPO's reward functions: resolved and tried on a few rows; GRPO's checks
  generation   GRPO's generation mode (transformers or vLLM colocate): can it run, TRL's arguments
"""
