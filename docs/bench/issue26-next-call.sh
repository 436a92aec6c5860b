#!/bin/bash
# issue 26, prepared for the next session's device call (not run yet): what calls 1-3 left.
# 1) qwen3-0.6b: memcal's probe of the default run with --profile, alone (call 3's was cut while writing
#    its profile), to see what of finetune's step the bare Unsloth loop does not do;
# 2) llama-1b Unsloth LoRA, finetune vs bare (call 3 measured the bare row only: 57,008);
# 3) gemma3-1b Unsloth LoRA pair, with a row budget that allows Unsloth's first compile (~100-150 s).
# Needs .gpu/site.tgz (../shared/tools/gpu-site.sh) and the code in .gpu/ep (git archive HEAD entrypoints).
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false UNSLOTH_DISABLE_AUTO_PADDING_FREE=1
R=$PWD; mkdir -p /tmp/site; tar -C /tmp/site -xzf $R/.gpu/site.tgz
export PYTHONPATH=$R/.gpu/ep:/tmp/site
date -u; O=/tmp/o; mkdir -p $O $OUT/n; cd /tmp
finish() { tar -C $O -czf $OUT/n/probes.tgz . ; date -u; }
trap finish EXIT
timeout 150 python3 -m toolbox_train.planning.calibration probe --shape qwen3-0.6b --variant default --warmup 6 \
  --steps 20 --profile --out $O --workdir /tmp/w > $O/log-probe.txt 2>&1; grep -h "memcal probe" $O/log-probe.txt | cut -c1-140
timeout 420 python3 $R/docs/bench/issue26_rows.py $OUT/n 200 \
  'llama-1b/bare-unsloth-lora,llama-1b/finetune-unsloth-lora' \
  'gemma3-1b/bare-unsloth-lora,gemma3-1b/finetune-unsloth-lora' > $O/rows-log.txt 2>&1
grep -E "^bench: |RATIO" $O/rows-log.txt | grep -v "^bench: ---"
