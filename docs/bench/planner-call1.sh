#!/bin/bash
# device call 1: memory calibration (parallel), qwen3 finetune-unsloth-lora probes + profile, bare Unsloth reference
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
R=$PWD; O=/tmp/o; W=/tmp/w; mkdir -p $O /tmp/site
tar -C /tmp/site -xzf $R/.gpu/site.tgz
export PYTHONPATH=$R/.gpu/planner/ep:/tmp/site
cd /tmp
date -u; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
finish() { cp $O/memory.json $OUT/ 2>/dev/null; tar -C $O -czf $OUT/all.tgz . ; }
trap finish EXIT
timeout 290 python3 -m toolbox_train.bench.calibration memory --out $O --workdir $W --parallel 6 --budget-gib 120 > $O/memory.log 2>&1
grep memcal: $O/memory.log
date -u
timeout 110 python3 -m toolbox_train.bench.calibration probe --shape qwen3-0.6b --variant default --profile --out $O --workdir $W > $O/p-default.log 2>&1; grep "memcal probe" $O/p-default.log
cp /tmp/unsloth_compiled_cache/UnslothSFTTrainer.py $O/ 2>/dev/null
timeout 80 python3 -m toolbox_train.bench.calibration probe --shape qwen3-0.6b --variant nolog-notokens --out $O --workdir $W > $O/p-nolog.log 2>&1; grep "memcal probe" $O/p-nolog.log
date -u
timeout 90 python3 -m toolbox_train.bench run --shapes qwen3-0.6b --rows 'qwen3-0.6b/bare-unsloth-lora' --warmup 5 --steps 10 --row-timeout 85 --out $O/b --workdir $W/b --no-chart > $O/bare.log 2>&1; grep "bench: qwen" $O/bare.log
date -u
