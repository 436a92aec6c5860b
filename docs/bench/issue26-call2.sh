#!/bin/bash
# issue 26, device call 2: the speed pick (finetune hf full, per_device_batch_size: auto -> 16 on the
# H200, checkpointing auto -> off) against bare HF + Liger at the same batch; then qwen3-0.6b Unsloth
# LoRA again, three interleaved repeats, with 6 warm-up + 20 timed steps a row (call 1's 3 + 10 left
# both loops still warming: step times falling through the timed window).
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false WARMUP=6 STEPS=20
R=$PWD; mkdir -p /tmp/site; tar -C /tmp/site -xzf $R/.gpu/site.tgz
export PYTHONPATH=$R/.gpu/ep:/tmp/site
date -u; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
mkdir -p $OUT/c2; cd /tmp
timeout ${LIMIT:-550} python3 $R/.gpu/issue26_rows.py $OUT/c2 110 \
  'llama-1b/bare-hf-full+batch=16+liger,llama-1b/finetune-hf-full+batch=auto' \
  '3*qwen3-0.6b/bare-unsloth-lora,qwen3-0.6b/finetune-unsloth-lora' \
  > $OUT/c2/log.txt 2>&1
echo "rc $?"; grep -E "^bench: |RATIO|median" $OUT/c2/log.txt | grep -v "^bench: ---"; grep -E "Error|error:" $OUT/c2/log.txt | tail -5
date -u
