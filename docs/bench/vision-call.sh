#!/bin/bash
# Issue 44, the vision rows still open after 2026-12-07 (docs/benchmarks.md "Vision-language SFT on an H100"):
# one device call (timeout_s 600) from the checkout's root, carry [".gpu/site.tgz"]:
#   bash docs/bench/vision-call.sh
# ROWS picks a set: `gap` (default; why Gemma 3's bare loop runs at 1.7x finetune, over 48 timed
# steps, three times the bare loop's prefetch: the bare loop under autocast and at the Trainer's prefetch depth,
# finetune with accelerate's batch copy non-blocking and a log every 4th step, and with its vision tower compiled
# (inductor; and as CUDA graphs); PROFILE=1: torch.profiler over steps 3-4 of each row, its tables in profile-*.txt
# and a summary in each row; MEMTRACE off there), `qwen3` (Qwen3-VL's rows), `unsloth` (the Unsloth
# rows not reached), `qlora` (QLoRA against QLoRA references: the bare loop and TRL on a 4-bit model, Unsloth's
# recipe in 4 bits). Rows, logs, MEMTRACE sites and profile tables come back as one file, $OUT/vr.tgz (a call
# returns only a few files).
set -u
mkdir -p /tmp/site && tar -C /tmp/site -xzf .gpu/site.tgz
export PYTHONPATH=/tmp/site:$PWD:$PWD/entrypoints HF_HUB_OFFLINE=1 MEMTRACE=1 VR_WORK=/tmp/vrw ROW_TIMEOUT=${ROW_TIMEOUT:-200}
V=/tmp/vr; mkdir -p $V; date -u
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
case ${ROWS:-gap} in
  gap) export VR_TIMED=48 PROFILE=1 PROFILE_STACKS=1 MEMTRACE=0; set -- gemma3-4b-4l "bare finetune:hf:lora finetune:hf:lora:nonblocking=1,output.logging_steps=4 bare:autocast finetune:hf:lora:compile_tower=1,nonblocking=1,output.logging_steps=4 trl bare:train:autocast:prefetch2 finetune:hf:lora:compile_tower=cudagraphs,nonblocking=1,output.logging_steps=4" ;;
  qwen3) set -- qwen3-vl-8b-4l "finetune:hf:lora bare trl finetune:hf:lora:liger=false finetune:hf:qlora" ;;
  unsloth) set -- gemma3-4b-4l,qwen2.5-vl-7b-4l "finetune:unsloth:qlora unsloth-recipe" ;;
  qlora) set -- gemma3-4b-4l,qwen2.5-vl-7b-4l "bare:qlora trl:qlora unsloth-recipe:qlora finetune:hf:qlora" ;;
esac
[ -n "${PATHS:-}" ] && set -- "$1" "$PATHS"  # PATHS: a subset of the set's rows (a shorter call)
timeout ${LIMIT:-540} python docs/bench/vision_rows.py $V --shapes "$1" --paths "$2" 2>&1 | cut -c1-400
date -u; tar czf $OUT/vr.tgz -C $V --exclude='model-*' --exclude='run-*' --exclude='data-*' .
