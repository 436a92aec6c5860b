#!/bin/bash
# lead's device call: finetune defaults (gradient_checkpointing: auto) vs the bare loops, side by side in one call
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
R=$PWD; mkdir -p /tmp/site; tar -C /tmp/site -xzf $R/.gpu/site.tgz
export PYTHONPATH=$R/entrypoints:/tmp/site
date -u; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python3 -c "import torch,transformers,trl,peft,accelerate;print('torch',torch.__version__,'transformers',transformers.__version__,'trl',trl.__version__,'peft',peft.__version__,'accelerate',accelerate.__version__)"
cd /tmp
timeout 420 python3 -m toolbox_train.bench run --shapes llama-1b,qwen3-0.6b --row-timeout 95 --no-chart \
  --rows 'llama-1b/finetune-hf-full' --rows 'llama-1b/bare-hf-full+liger' \
  --rows 'qwen3-0.6b/finetune-unsloth-lora' --rows 'qwen3-0.6b/bare-unsloth-lora' --out $OUT/r 2>&1 | tail -40
date -u
