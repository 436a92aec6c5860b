#!/bin/bash
# Issue 44, the vision rows still open after 2026-12-07 (docs/benchmarks.md "Vision-language SFT on an H100"):
# one device call (timeout_s 600) from the checkout's root, carry [".gpu/site.tgz"]:
#   bash docs/bench/vision-call.sh
# ROWS picks a set: `gap` (default; where Gemma 3's host-bound step goes, over 48 timed
# steps, three times the bare loop's prefetch: finetune (its batch copy non-blocking since 4fa1444), with a log every
# 4th step, with Liger off the vision tower, with the tower compiled (inductor; and as CUDA graphs), against the bare
# loop, under autocast and at the Trainer's prefetch depth, and TRL; PROFILE=1: torch.profiler over steps 3-4 of each
# row, its tables in profile-*.txt and a summary in each row, without Python stacks: on 2026-12-07 they came back
# empty and slowed the profiled steps 1.4-1.75x; MEMTRACE off there; HOSTSPY=1: py-spy samples each row's host over
# its timed steps from another process, host_spy.py), `qwen3` (Qwen3-VL's rows), `unsloth` (the Unsloth
# rows not reached), `qlora` (QLoRA against QLoRA references: the bare loop and TRL on a 4-bit model, Unsloth's
# recipe in 4 bits). Rows, logs, MEMTRACE sites and profile tables come back as one file, $OUT/vr.tgz (a call
# returns only a few files).
set -u
mkdir -p /tmp/site && tar -C /tmp/site -xzf .gpu/site.tgz
export PYTHONPATH=/tmp/site:$PWD:$PWD/entrypoints HF_HUB_OFFLINE=1 MEMTRACE=1 VR_WORK=/tmp/vrw ROW_TIMEOUT=${ROW_TIMEOUT:-200}
export PATH=/tmp/site/bin:$PATH  # py-spy (HOSTSPY=1), in the site tarball since 2026-12-07 21:00 UTC
V=/tmp/vr; mkdir -p $V; date -u
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
case ${ROWS:-gap} in
  gap) export VR_TIMED=48 PROFILE=1 MEMTRACE=0 HOSTSPY=${HOSTSPY:-1}; set -- gemma3-4b-4l "bare finetune:hf:lora finetune:hf:lora:output.logging_steps=4 finetune:hf:lora:liger_tower=false,output.logging_steps=4 finetune:hf:lora:compile_tower=1,output.logging_steps=4 trl bare:autocast bare:train:autocast:prefetch2 finetune:hf:lora:compile_tower=cudagraphs,output.logging_steps=4" ;;
  qwen3) set -- qwen3-vl-8b-4l "finetune:hf:lora bare trl finetune:hf:lora:liger=false finetune:hf:qlora" ;;
  unsloth) set -- gemma3-4b-4l,qwen2.5-vl-7b-4l "finetune:unsloth:qlora unsloth-recipe" ;;
  qlora) set -- gemma3-4b-4l,qwen2.5-vl-7b-4l "bare:qlora trl:qlora unsloth-recipe:qlora finetune:hf:qlora" ;;
esac
[ -n "${PATHS:-}" ] && set -- "$1" "$PATHS"  # PATHS: a subset of the set's rows (a shorter call)
timeout ${LIMIT:-540} python docs/bench/vision_rows.py $V --shapes "$1" --paths "$2" 2>&1 | cut -c1-400
date -u; tar czf $OUT/vr.tgz -C $V --exclude='model-*' --exclude='run-*' --exclude='data-*' .
