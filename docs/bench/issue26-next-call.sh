#!/bin/bash
# issue 26, prepared for the next session's device calls (not run yet). Two calls, each under the 600 s limit:
#   bash docs/bench/issue26-next-call.sh qwen3   # call A: the qwen3-0.6b pair with the new default
#   bash docs/bench/issue26-next-call.sh rest    # call B: what calls 1-3 left
#   bash docs/bench/issue26-next-call.sh qwen3-head  # call C: the fused head's mask gather (train.lm_head_tokens)
#   bash docs/bench/issue26-next-call.sh table   # call D: the issue's table (qwen3 x3 interleaved, llama-1b HF full and Unsloth LoRA)
# A) qwen3-0.6b Unsloth LoRA, batch 8, seq 2048: bare, finetune with its defaults (output.step_metrics: loss,
#    no entropy/top-1 asked of the fused head) and finetune with step_metrics=deferred (the previous default:
#    entropy and top-1 computed every step), three interleaved repeats, medians; ratios of both finetune rows
#    to the bare row (issue26_rows.py pairs each finetune row with the bare row before it). A run cut by the
#    limit is summarised from the rows it finished (--summary).
# B) 1) qwen3-0.6b: memcal's probe of the default run with --profile, alone (call 3's was cut while writing
#       its profile), to see what of finetune's step the bare Unsloth loop does not do;
#    2) llama-1b Unsloth LoRA, finetune vs bare (call 3 measured the bare row only: 57,008);
#    3) gemma3-1b Unsloth LoRA pair, with a row budget that allows Unsloth's first compile (~100-150 s).
# C) qwen3-0.6b Unsloth LoRA as A: bare, finetune defaults (train.lm_head_tokens: all, no boolean-mask gather
#    in TRL's fused head, no host sync in the step's forward or backward) and finetune lm_head_tokens=labelled
#    (TRL's gather: the default of 408948c, the one A measured), three interleaved repeats, medians, ratios;
#    then which head ran (finetune logs 'train.lm_head_tokens: all: ...' once, from each finetune row).
# Needs .gpu/site.tgz (../shared/tools/gpu-site.sh) and the code in .gpu/ep (git archive HEAD entrypoints).
PART=${1:-qwen3}
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false UNSLOTH_DISABLE_AUTO_PADDING_FREE=1
R=$PWD; mkdir -p /tmp/site; tar -C /tmp/site -xzf $R/.gpu/site.tgz
export PYTHONPATH=$R/.gpu/ep:/tmp/site
date -u; O=/tmp/o; mkdir -p $O $OUT/n; cd /tmp
if [ "$PART" = table ]; then
  # D) the issue's table in one call, each finetune row beside its reference: qwen3-0.6b Unsloth LoRA as three
  #    interleaved repeats (medians), llama-1b HF full (+Liger) and llama-1b Unsloth LoRA pairs; then which
  #    fused head the finetune rows ran
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  G=('3*qwen3-0.6b/bare-unsloth-lora,qwen3-0.6b/finetune-unsloth-lora' 'llama-1b/bare-hf-full+liger,llama-1b/finetune-hf-full'
     'llama-1b/bare-unsloth-lora,llama-1b/finetune-unsloth-lora')
  timeout ${LIMIT:-545} python3 $R/docs/bench/issue26_rows.py $OUT/n 110 "${G[@]}" > $OUT/n/log-table.txt 2>&1
  echo "rc $?"
  [ -f $OUT/n/summary.json ] || python3 $R/docs/bench/issue26_rows.py --summary $OUT/n "${G[@]}"
  grep -E "^bench: |RATIO|median" $OUT/n/log-table.txt | grep -v "^bench: ---"
  grep -rh "lm_head_tokens: all" $OUT/n/ 2>/dev/null | sort | uniq -c | head -5
  date -u; exit 0
fi
if [ "$PART" = qwen3 ] || [ "$PART" = qwen3-head ]; then
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  G='3*qwen3-0.6b/bare-unsloth-lora,qwen3-0.6b/finetune-unsloth-lora,qwen3-0.6b/finetune-unsloth-lora+step_metrics=deferred'
  [ "$PART" = qwen3-head ] && G='3*qwen3-0.6b/bare-unsloth-lora,qwen3-0.6b/finetune-unsloth-lora,qwen3-0.6b/finetune-unsloth-lora+lm_head_tokens=labelled'
  timeout ${LIMIT:-540} python3 $R/docs/bench/issue26_rows.py $OUT/n 100 "$G" > $OUT/n/log-qwen3.txt 2>&1
  echo "rc $?"
  [ -f $OUT/n/summary.json ] || python3 $R/docs/bench/issue26_rows.py --summary $OUT/n "$G"
  grep -E "^bench: |RATIO|median" $OUT/n/log-qwen3.txt | grep -v "^bench: ---"
  grep -h '"step_metrics"' $OUT/n/results.json | sort | uniq -c  # loss (defaults) and deferred, as asked
  grep -rh "lm_head_tokens" $OUT/n/ 2>/dev/null | sort | uniq -c | head -5  # which head the finetune rows ran
  date -u; exit 0
fi
finish() { tar -C $O -czf $OUT/n/probes.tgz . ; date -u; }
trap finish EXIT
timeout 150 python3 -m toolbox_train.bench.calibration probe --shape qwen3-0.6b --variant default --warmup 6 \
  --steps 20 --profile --out $O --workdir /tmp/w > $O/log-probe.txt 2>&1; grep -h "memcal probe" $O/log-probe.txt | cut -c1-140
timeout 420 python3 $R/docs/bench/issue26_rows.py $OUT/n 200 \
  'llama-1b/bare-unsloth-lora,llama-1b/finetune-unsloth-lora' \
  'gemma3-1b/bare-unsloth-lora,gemma3-1b/finetune-unsloth-lora' > $O/rows-log.txt 2>&1
grep -E "^bench: |RATIO" $O/rows-log.txt | grep -v "^bench: ---"
