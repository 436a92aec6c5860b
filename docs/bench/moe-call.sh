#!/bin/bash
# issue 26, the mixture-of-experts rows (prepared, not run yet): one device call, under 540 s.
#   bash docs/bench/moe-call.sh
# gpt-oss-20b-4l (bench/shapes.py: GPT-OSS-20B's config cut to 4 layers, random bf16 weights, 4.45B parameters,
# 8.3 GiB; 32 experts, 4 active per token), LoRA r16, seq 1024, batch 8 (8,192 tokens a step; the 201,088-token
# vocabulary makes the bare HF loop's own loss hold ~23 GiB of logits and their gradients at this size, and
# transformers' GPT-OSS attention is eager (no SDPA: attention sinks), so seq 2048 x batch 8 would not fit an
# H100 without checkpointing), 3 warm-up + 10 timed steps, each row in its own process:
#   HF:      bare-hf-lora (plain), bare-hf-lora+liger (finetune's default on a GPU is liger: auto -> on, so this
#            is its like-for-like reference; issue26_rows.py pairs finetune with the last bare row before it),
#            finetune-hf-lora (defaults)
#   Unsloth: bare-unsloth-lora, finetune-unsloth-lora (defaults)
# Row budget 190 s (Unsloth's first compile ~100-150 s; an HF row should take ~1 minute, most of it imports and
# loading 8.3 GiB); the model is built once (GPU init, ~9 GB written to /tmp) before the first row, outside the
# row budgets; the whole run is cut at 520 s and summarised from the rows it finished (--summary).
# The same adapters on both backends and in both loops: attention + per-expert LoRA (PEFT target_parameters for
# mlp.experts.gate_up_proj/down_proj: finetune's HF path since 7f6cf03, the bare HF loops since 3cff83d, Unsloth's
# get_peft_model itself). Compare finetune to bare within a backend (the expert kernels differ across them).
# Needs .gpu/site.tgz (../shared/tools/gpu-site.sh) and the code in .gpu/ep (git archive HEAD entrypoints).
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false UNSLOTH_DISABLE_AUTO_PADDING_FREE=1
R=$PWD; mkdir -p /tmp/site; tar -C /tmp/site -xzf $R/.gpu/site.tgz
export PYTHONPATH=$R/.gpu/ep:/tmp/site SEQ=1024 BATCH=8
date -u; mkdir -p $OUT/n; cd /tmp
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
df -h /tmp | tail -1
HF='gpt-oss-20b-4l/bare-hf-lora,gpt-oss-20b-4l/bare-hf-lora+liger,gpt-oss-20b-4l/finetune-hf-lora'
US='gpt-oss-20b-4l/bare-unsloth-lora,gpt-oss-20b-4l/finetune-unsloth-lora'
# one run_matrix for both groups (the model is built once); row budget 190 s (Unsloth's compile), whole run 520 s
timeout 520 python3 $R/docs/bench/issue26_rows.py $OUT/n 190 "$HF" "$US" > $OUT/n/log.txt 2>&1
echo "rc $?"
[ -f $OUT/n/summary.json ] || python3 $R/docs/bench/issue26_rows.py --summary $OUT/n "$HF" "$US"
grep -E "^bench: |RATIO|median" $OUT/n/log.txt | grep -v "^bench: ---"
# MFU (MoE-aware: 4 of 32 experts count) and what each row trained
python3 - <<'EOF'
import glob, json, os
for f in sorted(glob.glob(os.environ["OUT"] + "/n/results.json")):
    for r in json.load(open(f))["rows"]:
        if r.get("status") == "ok":
            rs = (r.get("resolved") or {}).get("_resolved") or {}
            print(f"{r['id']}: mfu {r.get('mfu') and round(100 * r['mfu'], 1)}%, step {r['step_s']:.3f} s, "
                  f"tokens/step {r['tokens_per_step']:.0f}, wall {r['wall_s']:.0f} s, peak {r.get('peak_gib')}, "
                  f"finetune's ckpt {rs.get('gradient_checkpointing')} liger {rs.get('liger')} "
                  f"predicted {rs.get('predicted_peak_gib')} GiB")
EOF
grep -hiE "(Unsloth.*(MoE|expert|grouped))|target_parameters|trainable param|finetune: memory plan" $OUT/n/log.txt | cut -c1-200 | sort | uniq -c | head -12
date -u
