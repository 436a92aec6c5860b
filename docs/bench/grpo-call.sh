#!/bin/bash
# Issue 32, GRPO generation speed (prepared, not run yet): one device call, under 540 s, on one GPU.
#   device command:  bash docs/bench/grpo-call.sh        carry: [".gpu"]
# What share of a GRPO step `finetune` spends in transformers' generate (TRL 1.15's default generation):
# llama-1b and qwen3-0.6b shapes (bench/shapes.py, random init, bf16), LoRA r16 on every projection, backend hf,
# 2 prompts x 8 generations = 16 completions a step, prompts 128 tokens, completions 256 tokens (a random-init
# model never samples EOS, so each runs the full 256), gradient accumulation 1 (one generation per step),
# 2 warm-up + 8 timed steps, each row its own process (docs/bench/grpo_rows.py). Per step: wall time (device
# synchronized), time inside TRL's "transformers.generate" block and inside _prepare_inputs (generation +
# rewards + advantages), their shares. Rows -> $OUT/grpo/grpo-rows.json, logs beside them; the models stay in
# /tmp. SHAPES, PROMPT, COMPLETION, GENS, BATCH, WARMUP, STEPS, GENERATION (transformers|vllm-colocate) override.
# The vLLM colocate rows are not part of this call: vLLM 0.31/0.32 need torch 2.13.0 (the device has 2.11)
# and several GB of CUDA wheels, which neither the device (no network) nor the 64 MiB carry can bring.
# Needs .gpu/site.tgz (../shared/tools/gpu-site.sh: TRL, datasets, ...) and the code in .gpu/ep (git archive HEAD
# entrypoints; EP= names another code tree, e.g. EP=entrypoints for this checkout's).
# CPU dry run (tiny shape, this checkout's code, no site tarball):
#   DEVICE=cpu SHAPES=tiny-llama PROMPT=16 COMPLETION=16 GENS=4 BATCH=8 WARMUP=1 STEPS=3 EP=entrypoints SITE= \
#     PY=.venv/bin/python OUT=/tmp/grpo-out bash docs/bench/grpo-call.sh
set -u
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false DEVICE=${DEVICE:-cuda}
R=$PWD; EP=${EP:-$R/.gpu/ep}; [ -d "$EP" ] || EP=$R/entrypoints
case $EP in /*) ;; *) EP=$R/$EP ;; esac
PY=${PY:-python3}; SITE=${SITE-/tmp/site}; OUT=${OUT:-/tmp/grpo-out}; WORK=${WORK:-/tmp/grpo-work}
[ -n "$SITE" ] && { mkdir -p $SITE; tar -C $SITE -xzf $R/.gpu/site.tgz; }
export PYTHONPATH=$EP${SITE:+:$SITE}
mkdir -p $OUT/grpo $WORK
date -u
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null
$PY -c 'import torch, transformers, trl; print("torch", torch.__version__, "transformers", transformers.__version__, "trl", trl.__version__)' 2>&1 | tail -1
timeout ${LIMIT:-520} $PY $R/docs/bench/grpo_rows.py $OUT/grpo $WORK --shapes ${SHAPES:-llama-1b,qwen3-0.6b} \
  --generation ${GENERATION:-transformers}
echo "rc $?"
# one line per row: the share of the timed steps' wall time spent in generate
$PY - "$OUT/grpo/grpo-rows.json" <<'EOF'
import json, sys
try:
    rows = json.load(open(sys.argv[1]))
except (OSError, ValueError) as exc:
    sys.exit(f"no rows: {exc}")
for r in rows:
    if "error" in r:
        print(f"GRPO_SHARE {r['shape']} {r['generation']}: error {r['error']}")
        continue
    print(f"GRPO_SHARE {r['shape']} {r['generation']} on {r['device']}: step {r['step_s_mean']} s, generate "
          f"{r['generate_s_mean']} s = {100 * r['generate_share']:.1f}% (generation + scoring "
          f"{100 * r['generation_and_scoring_share']:.1f}%), {r['generated_tokens_per_s']} generated tokens/s, "
          f"peak {r.get('peak_gib')} GiB; {r['timed_steps']} timed steps, settings {r['settings']}")
EOF
date -u
