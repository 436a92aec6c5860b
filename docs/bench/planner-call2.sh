#!/bin/bash
# device call 2: per-step overhead A/B (qwen3-0.6b unsloth lora; llama-1b hf full), each row alone on the GPU
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
R=$PWD; O=/tmp/o; W=/tmp/w; mkdir -p $O $W /tmp/site
tar -C /tmp/site -xzf $R/.gpu/site.tgz
export PYTHONPATH=$R/.gpu/planner/ep:/tmp/site
cd /tmp
date -u; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
finish() { tar -C $O -czf $OUT/all.tgz . ; }
trap finish EXIT
p() { l=$O/log-$(echo "$@" | tr -c 'a-z0-9.\n-' _).txt; timeout ${T:-68} python3 -m toolbox_train.bench.calibration probe --warmup 5 --steps 20 --out $O --workdir $W "$@" > $l 2>&1; grep -h "memcal probe" $l | cut -c1-100; grep -h "Error" $l | tail -2; }
T=80 p --shape qwen3-0.6b --variant bare
p --shape qwen3-0.6b --variant default
p --shape qwen3-0.6b --variant lean
date -u
