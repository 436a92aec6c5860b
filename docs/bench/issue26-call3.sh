#!/bin/bash
# issue 26, device call 3: where qwen3-0.6b's remaining gap is (memcal's probe: finetune with a
# synchronised step timer, 6 warm-up + 20 timed steps; torch.profiler + cProfile over 5 more steps of
# the default run), then llama-1b Unsloth LoRA, finetune defaults vs the bare loop (the table's first row).
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false UNSLOTH_DISABLE_AUTO_PADDING_FREE=1
R=$PWD; mkdir -p /tmp/site; tar -C /tmp/site -xzf $R/.gpu/site.tgz
export PYTHONPATH=$R/.gpu/ep:/tmp/site
date -u; O=/tmp/o; mkdir -p $O $OUT/c3; cd /tmp
finish() { tar -C $O -czf $OUT/c3/probes.tgz . ; date -u; }
trap finish EXIT
p() { timeout ${T:-80} python3 -m toolbox_train.bench.calibration probe --shape qwen3-0.6b --warmup 6 --steps 20 \
        --out $O --workdir /tmp/w "$@" > $O/log-$(echo "$@" | tr -c 'a-z0-9\n-' _).txt 2>&1; grep -h "memcal probe" $O/log-*.txt | tail -1 | cut -c1-140; }
p --variant bare
T=100 p --variant default --profile
p --variant bare2
p --variant nolog
timeout 200 python3 $R/.gpu/issue26_rows.py $OUT/c3 95 'llama-1b/bare-unsloth-lora,llama-1b/finetune-unsloth-lora' > $O/rows-log.txt 2>&1
grep -E "^bench: |RATIO" $O/rows-log.txt | grep -v "^bench: ---"
