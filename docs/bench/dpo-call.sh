#!/bin/bash
# Issue 24's device call (for the speed helper, who holds the GPU): DPO LoRA rows on one H200 in
# the cuda stack's versions (TRL 1.15.0, transformers 5.17.0, Unsloth 2026.10.9), finetune vs TRL's
# DPOTrainer + PEFT vs the same under Unsloth; rows -> $OUT/dpo-rows.json, logs beside them.
# Not run yet: it waits for a device call. Add the rows to docs/benchmarks.md ("DPO") when it has run.
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
R=$PWD
export PYTHONPATH=$R/entrypoints${PYTHONPATH:+:$PYTHONPATH}
date -u; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python3 -c 'import trl, transformers, unsloth; print("trl", trl.__version__, "transformers", transformers.__version__, "unsloth", unsloth.__version__)'
timeout 560 python3 $R/docs/bench/dpo_rows.py $OUT --shapes llama-1b,qwen3-0.6b --paths finetune,trl,trl-unsloth
date -u
