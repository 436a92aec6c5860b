#!/bin/bash
# issue 33's device calls, on one H200 (each under the 600 s limit):
#   bash .gpu/src/docs/bench/issue33-call.sh rows     # call 1: GPT-OSS HF at par? + the preference peaks
#   bash .gpu/src/docs/bench/issue33-call.sh export   # call 2: the GGUF export record (export-call.sh)
# rows) 1. gpt-oss-20b-4l (seq 1024 x batch 8) HF LoRA, three interleaved repeats of: bare + Liger (the
#          reference), finetune's defaults (train.lm_head_kernel auto: Liger's fused cross-entropy for the loss,
#          as the bare loop), finetune with TRL's fused head (lm_head_kernel=trl: what 2026-12-06's 0.934x ran);
#          medians, each finetune row's ratio to the bare row (issue26_rows.py);
#       2. the preference rows whose peaks the memory plan is checked against (dpo_rows.py, llama-1b, prompt
#          512 + completion 512, batch 4): DPO and ORPO finetune hf, and TRL's DPOTrainer under Unsloth (fixed:
#          load_in_4bit=False with load_in_16bit).
# moe) gpt-oss-20b-4l (seq 1024 x batch 8) HF LoRA, three interleaved repeats, both sides training the same
#          objective: bare + Liger with the router's load-balancing loss (the model config's coefficient, as TRL's
#          SFTTrainer) against finetune's defaults (its sync-free step now takes the router loss: Liger's head), and
#          with MOE_ZERO=1 both again with train.router_aux_loss_coef=0 (no router loss); no preference rows.
# speed) alone, or after `moe` in the same call when given as `moe+speed`: llama-1b HF full (seq 2048), three interleaved
#          repeats of bare + Liger at batch 16 (the reference), finetune's speed pick (per_device_batch_size: auto)
#          and the pick with Liger's fused cross-entropy as the loss head (lm_head_kernel=liger: no recomputed
#          logits tiles in the backward); whatever time LIMIT_ALL (default 560 s) leaves.
# export) docs/bench/export-call.sh as it is, with the tarballs of docs/bench/build_llama_tools.py in .gpu/llama.
# Needs in the checkout's .gpu/ (carry .gpu): site.tgz (the cuda stack's site-packages), src/ (git archive HEAD
# entrypoints docs/bench), llama/ (export only). CPU dry run of `rows`: DRY=1 (tiny shapes, no Liger/Unsloth rows).
PART=${1:-rows}
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false UNSLOTH_DISABLE_AUTO_PADDING_FREE=1
R=$PWD; S=${S:-$R/.gpu/src}
if [ -z "${DRY:-}" ]; then
  mkdir -p /tmp/site; tar -C /tmp/site -xzf $R/.gpu/site.tgz
  export PYTHONPATH=$S/entrypoints:/tmp/site
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
fi
date -u; OUT=${OUT:-/tmp/issue33-out}; mkdir -p $OUT
if [ "$PART" = export ]; then
  cd $S && mkdir -p .gpu && ln -sfn $R/.gpu/site.tgz .gpu/site.tgz && ln -sfn $R/.gpu/llama .gpu/llama \
    && ln -sfn $S/entrypoints .gpu/ep
  OUT=$OUT bash docs/bench/export-call.sh
  exit $?
fi
G='3*gpt-oss-20b-4l/bare-hf-lora+liger,gpt-oss-20b-4l/finetune-hf-lora,gpt-oss-20b-4l/finetune-hf-lora+lm_head_kernel=trl'
SPEED=; [ "$PART" = moe+speed ] && { PART=moe; SPEED=1; }
[ "$PART" = speed ] && { PART=moe; SPEED=only; }
[ "$PART" = moe ] && G='3*gpt-oss-20b-4l/bare-hf-lora+liger,gpt-oss-20b-4l/finetune-hf-lora'
[ "$PART" = moe ] && [ -n "${MOE_ZERO:-}" ] && G="$G,gpt-oss-20b-4l/bare-hf-lora+liger+router_aux_loss_coef=0,gpt-oss-20b-4l/finetune-hf-lora+router_aux_loss_coef=0"
PY=python3; DEV=cuda
if [ -n "${DRY:-}" ]; then
  [ -n "$G" ] && G='1*tiny-gpt-oss/bare-hf-lora,tiny-gpt-oss/finetune-hf-lora,tiny-gpt-oss/finetune-hf-lora+lm_head_kernel=trl'
  [ "$PART" = moe ] && [ -n "$G" ] && G='1*tiny-gpt-oss/bare-hf-lora,tiny-gpt-oss/finetune-hf-lora,tiny-gpt-oss/bare-hf-lora+router_aux_loss_coef=0,tiny-gpt-oss/finetune-hf-lora+router_aux_loss_coef=0'
  PY=${PY_DRY:-python3}; DEV=cpu; export DEVICE=cpu SEQ=64 BATCH=2 WARMUP=1 STEPS=2
else
  export SEQ=1024 BATCH=8
fi
[ "$SPEED" = only ] && G=  # (2026-12-06 11:30, before this line: `speed` ran the moe rows first too)
mkdir -p $OUT/gptoss; cd /tmp
[ -n "$G" ] && {
timeout ${LIMIT_GPTOSS:-330} $PY $S/docs/bench/issue26_rows.py $OUT/gptoss 120 "$G" > $OUT/gptoss/log.txt 2>&1
echo "gpt-oss rc $?"
[ -f $OUT/gptoss/summary.json ] || $PY $S/docs/bench/issue26_rows.py --summary $OUT/gptoss "$G"
grep -E "^bench: |RATIO|median" $OUT/gptoss/log.txt | grep -v "^bench: ---"
grep -rh "lm_head_kernel\|lm_head_tokens: all" $OUT/gptoss/ 2>/dev/null | cut -c1-160 | sort | uniq -c | head -5
}
if [ -n "$SPEED" ]; then
  SG='3*llama-1b/bare-hf-full+liger+batch=16,llama-1b/finetune-hf-full+batch=auto,llama-1b/finetune-hf-full+batch=auto+lm_head_kernel=liger'
  [ -n "${DRY:-}" ] && SG='1*tiny-llama/bare-hf-full+batch=4,tiny-llama/finetune-hf-full+batch=auto,tiny-llama/finetune-hf-full+batch=auto+lm_head_kernel=liger'
  [ -n "${DRY:-}" ] || export SEQ=2048 BATCH=8
  left=$(( ${LIMIT_ALL:-560} - SECONDS )); mkdir -p $OUT/speed
  timeout $left $PY $S/docs/bench/issue26_rows.py $OUT/speed 120 "$SG" > $OUT/speed/log.txt 2>&1
  echo "speed rc $?"
  [ -f $OUT/speed/summary.json ] || $PY $S/docs/bench/issue26_rows.py --summary $OUT/speed "$SG"
  grep -E "^bench: |RATIO|median" $OUT/speed/log.txt | grep -v "^bench: ---"
  grep -rh "per_device_batch_size\|lm_head_kernel" $OUT/speed/ 2>/dev/null | cut -c1-160 | sort | uniq -c | head -8
fi
[ -n "${DRY:-}" ] || [ "$PART" = moe ] && { date -u; exit 0; }  # the preference rows: GPU-only, `rows` only
unset SEQ BATCH
for spec in dpo:finetune,trl-unsloth orpo:finetune; do
  left=$(( ${LIMIT_ALL:-560} - SECONDS )); [ $left -gt 40 ] || break
  timeout $left python3 $S/docs/bench/dpo_rows.py $OUT/pref --shapes llama-1b --paths ${spec#*:} --objective ${spec%%:*}
done
grep -h "trainer class" $OUT/pref/*.log 2>/dev/null; tail -3 $OUT/pref/*trl-unsloth*.log 2>/dev/null | cut -c1-300
rm -rf $OUT/pref/model-* $OUT/pref/run-* $OUT/pref/trl-* $OUT/pref/*.jsonl
date -u
