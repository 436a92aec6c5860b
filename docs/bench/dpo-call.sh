#!/bin/bash
# Issue 24's device call (for the speed helper, who holds the GPU): DPO LoRA rows on one H200 in the
# cuda stack's versions (TRL 1.15.0, transformers 5.17.0, Unsloth 2026.10.9): finetune vs TRL's
# DPOTrainer + PEFT vs the same DPOTrainer under Unsloth, and finetune on the Unsloth backend.
# One shape per call (SHAPES=llama-1b, then SHAPES=qwen3-0.6b): four rows, each its own process.
# Rows -> $OUT/dpo-rows.json, logs beside them (each names the trainer class, Unsloth's patched one
# under Unsloth). Not run yet: it waits for a device call; the rows then go to docs/benchmarks.md.
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
R=$PWD
export PYTHONPATH=$R/entrypoints${PYTHONPATH:+:$PYTHONPATH}
date -u; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python3 -c 'import trl, transformers, unsloth; print("trl", trl.__version__, "transformers", transformers.__version__, "unsloth", unsloth.__version__)'
timeout 560 python3 $R/docs/bench/dpo_rows.py $OUT --shapes ${SHAPES:-llama-1b} --paths finetune,trl,trl-unsloth,finetune-unsloth
date -u
