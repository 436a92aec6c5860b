#!/bin/bash
# Issue 41, GRPO sampler speed: one device call (timeout_s <= 580) on one GPU; carry: [".gpu"] (site.tgz from
# ../shared/tools/gpu-site.sh). finetune GRPO steps with TRL's default `generate` (grpo.generation: transformers,
# dynamic cache) against what grpo.generation: auto picks there (transformers-static: static cache, compiled
# decoding), llama-1b then qwen3-0.6b (bench/shapes.py, random init, bf16), LoRA r16 on every projection, backend
# hf, 2 prompts x 8 = 16 completions a step, prompts 128 tokens, completions 256 (a random-init model never stops
# early), gradient accumulation 1, WARMUP 2 + STEPS 4 timed per row, each row its own process, REPEATS rounds
# with the samplers' order flipped each round (docs/bench/grpo_rows.py --repeats). Rows -> $OUT/grpo/grpo-rows.json
# after each row (a cut call keeps what ran), logs beside them.
# GENERATION lists the rows' samplers, each as BACKEND:GENERATION or plain (backend hf); GRPO_RATIO compares each
# to BASE (default transformers). The Unsloth rows (issue 41's second call):
#   GENERATION=unsloth:transformers,unsloth:transformers-static,hf:transformers-static BASE=unsloth:transformers
#   SHAPES=llama-1b; SITE_TGZ names the site tarball when the call runs from an unpacked code archive.
# CPU dry run (tiny shape, no site tarball):
#   DEVICE=cpu SHAPES=tiny-llama PROMPT=16 COMPLETION=16 GENS=4 BATCH=8 WARMUP=1 STEPS=2 REPEATS=1 SITE= \
#     PY=/work/main/.venv/bin/python OUT=/tmp/grpo-speed bash docs/bench/grpo-speed-call.sh
set -u
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false DEVICE=${DEVICE:-cuda}
export WARMUP=${WARMUP:-2} STEPS=${STEPS:-4}
R=$PWD; PY=${PY:-python3}; SITE=${SITE-/tmp/site}; OUT=${OUT:-/tmp/grpo-speed}; WORK=${WORK:-/tmp/grpo-work}
[ -n "$SITE" ] && { mkdir -p $SITE; tar -C $SITE -xzf ${SITE_TGZ:-$R/.gpu/site.tgz}; }
export PYTHONPATH=$R/entrypoints${SITE:+:$SITE}
mkdir -p $OUT/grpo $WORK
date -u
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null
$PY -c 'import torch, transformers, trl, peft; print("torch", torch.__version__, "transformers", transformers.__version__, "trl", trl.__version__, "peft", peft.__version__)' 2>&1 | tail -1
case ${GENERATION:-} in *unsloth:*) $PY -c 'from importlib.metadata import version as v; print("unsloth", v("unsloth"), "unsloth_zoo", v("unsloth_zoo"))' 2>&1 | tail -1 ;; esac
timeout ${LIMIT:-540} $PY $R/docs/bench/grpo_rows.py $OUT/grpo $WORK --shapes ${SHAPES:-llama-1b,qwen3-0.6b} \
  --generation ${GENERATION:-transformers,auto} --repeats ${REPEATS:-2}
echo "rc $?"
$PY - "$OUT/grpo/grpo-rows.json" "${BASE:-transformers}" <<'PYEOF'
import json, statistics, sys
base_gen = sys.argv[2]
try:
    rows = json.load(open(sys.argv[1]))
except (OSError, ValueError) as exc:
    sys.exit(f"no rows: {exc}")
by = {}
for r in rows:
    if "error" in r:
        print(f"GRPO_SPEED {r['shape']} {r['generation']} r{r.get('repeat')}: error {r['error']}")
        continue
    by.setdefault((r["shape"], r["generation"]), []).append(r)
    print(f"GRPO_SPEED {r['shape']} {r['generation']} r{r['repeat']} ({r['sampler_args']}) on {r['device']}: step "
          f"{r['step_s_mean']} s, generate {100 * r['generate_share']:.1f}%, {r['generated_tokens_per_s']} gen tok/s, "
          f"peak {r.get('peak_gib')} GiB")
for shape, gen in sorted(by):
    base, fast = by.get((shape, base_gen)), by[(shape, gen)]
    if base and gen != base_gen:
        b = statistics.median(x["step_s_mean"] for x in base)
        f = statistics.median(x["step_s_mean"] for x in fast)
        print(f"GRPO_RATIO {shape}: {base_gen} {b:.3f} s/step, {gen} {f:.3f} s/step = {b / f:.2f}x "
              f"(medians of {len(base)} and {len(fast)} rows)")
PYEOF
date -u
