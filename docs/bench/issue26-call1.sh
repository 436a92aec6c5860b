#!/bin/bash
# issue 26, device call 1: the issue's table re-measured after the host-side fixes, one call.
# qwen3-0.6b Unsloth LoRA: three interleaved repeats (bare, finetune, bare, finetune, ...), medians;
# llama-1b HF full (finetune defaults vs bare HF + Liger); then finetune with the pre-issue-26
# defaults turned back on (attribution). Code: the snapshot in .gpu/ep (toolbox_train as committed).
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
R=$PWD; mkdir -p /tmp/site; tar -C /tmp/site -xzf $R/.gpu/site.tgz
export PYTHONPATH=$R/.gpu/ep:/tmp/site
date -u; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python3 -c "import torch,transformers,trl,peft,accelerate;print('torch',torch.__version__,'transformers',transformers.__version__,'trl',trl.__version__,'peft',peft.__version__,'accelerate',accelerate.__version__)"
mkdir -p $OUT/c1; cd /tmp
set -o pipefail
timeout ${LIMIT:-545} python3 $R/.gpu/issue26_rows.py $OUT/c1 100 \
  '3*qwen3-0.6b/bare-unsloth-lora,qwen3-0.6b/finetune-unsloth-lora' \
  'llama-1b/bare-hf-full+liger,llama-1b/finetune-hf-full' \
  'qwen3-0.6b/finetune-unsloth-lora+loader_workers=0+nan_inf_filter+optim=adamw_torch+step_metrics=synced' \
  > $OUT/c1/log.txt 2>&1
echo "rc $?"; grep -E "^bench: |RATIO|median" $OUT/c1/log.txt | grep -v "^bench: ---"; grep -E "Error|error" $OUT/c1/log.txt | tail -5
date -u
