#!/bin/bash
# Issues 41 and 46, GRPO sampler speed: one device call (timeout_s <= 580) on one GPU; carry: [".gpu"] (site.tgz from
# ../shared/tools/gpu-site.sh). finetune GRPO steps on llama-1b (bench/shapes.py, random init, bf16), LoRA r16 on
# every projection, backend hf, 2 prompts x 8 = 16 completions a step, prompts 128 tokens, completions 256 (a
# random-init model never stops early), gradient accumulation 1, WARMUP 2 + STEPS 3 timed per row, each row its own
# process, REPEATS rounds with the samplers' order flipped each round (docs/bench/grpo_rows.py --repeats). Rows ->
# $OUT/grpo/grpo-rows.json after each row (a cut call keeps what ran), logs beside them; on a GPU all of it packed
# at the end as $OUT/grpo.tgz, with grpo-rows.json copied beside it.
# GENERATION lists the rows, each [tools:][BACKEND:]SAMPLER[+nomerge] (backend hf unless named; +nomerge sets
# grpo.merge_lora: false). The default (issue 46; the compiled row not run on a GPU yet, its compile time unknown):
#   transformers+nomerge  TRL's default: generate's dynamic cache, LoRA unmerged (plain `transformers` merges now)
#   transformers-static   static cache + transformers' compiled decoding + LoRA merged (auto's pick)
#   compiled              the Toolbox's decoding loop (generation/decode.py: CUDA graphs, host check every 32
#                         tokens) + LoRA merged; auto picks it only once this row measures it faster
#   tools:compiled        a tool-calling row: grpo.tools (add(a, b)), first turn scripted (docs/bench/grpo_tools_row.py)
# GRPO_RATIO compares each to BASE (default transformers+nomerge); GRPO_TOOLS gives the tool row's logged metrics.
# Issue 41's rows: GENERATION=transformers,auto SHAPES=llama-1b,qwen3-0.6b BASE=transformers. The Unsloth rows:
#   GENERATION=unsloth:transformers,unsloth:transformers-static,hf:transformers-static BASE=unsloth:transformers
#   SHAPES=llama-1b; SITE_TGZ names the site tarball when the call runs from an unpacked code archive.
# CPU dry run (tiny shape, no site tarball; COMPLETION 200: the tool row's scripted call and result take 158):
#   DEVICE=cpu SHAPES=tiny-llama PROMPT=16 COMPLETION=200 GENS=4 BATCH=8 WARMUP=1 STEPS=2 REPEATS=1 SITE= \
#     PY=/work/main/.venv/bin/python OUT=/tmp/grpo-speed bash docs/bench/grpo-speed-call.sh
# The compiled loop (issue 46, grpo.generation: compiled) beside the static sampler, the same CPU dry run:
#   GENERATION=transformers-static,compiled BASE=transformers-static DEVICE=cpu SHAPES=tiny-llama PROMPT=16 \
#     COMPLETION=200 GENS=4 BATCH=8 WARMUP=1 STEPS=2 REPEATS=1 SITE= PY=/work/main/.venv/bin/python \
#     OUT=/tmp/grpo-speed bash docs/bench/grpo-speed-call.sh
set -u
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false DEVICE=${DEVICE:-cuda}
export WARMUP=${WARMUP:-2} STEPS=${STEPS:-3}
R=$PWD; PY=${PY:-python3}; SITE=${SITE-/tmp/site}; OUT=${OUT:-/tmp/grpo-speed}; WORK=${WORK:-/tmp/grpo-work}
[ -n "$SITE" ] && { mkdir -p $SITE; tar -C $SITE -xzf ${SITE_TGZ:-$R/.gpu/site.tgz}; }
export PYTHONPATH=$R/entrypoints${SITE:+:$SITE}
# HOSTSPY=1 (default): py-spy (the site tarball's bin/) samples each row's host over its timed steps from another
# process, never pausing it (docs/bench/host_spy.py): where a step's host time goes, beside its timing
export PATH=${SITE:+$SITE/bin:}$PATH HOSTSPY=${HOSTSPY:-1}
mkdir -p $OUT/grpo $WORK
date -u
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null
$PY -c 'import torch, transformers, trl, peft; print("torch", torch.__version__, "transformers", transformers.__version__, "trl", trl.__version__, "peft", peft.__version__)' 2>&1 | tail -1
case ${GENERATION:-} in *unsloth:*) $PY -c 'from importlib.metadata import version as v; print("unsloth", v("unsloth"), "unsloth_zoo", v("unsloth_zoo"))' 2>&1 | tail -1 ;; esac
timeout ${LIMIT:-520} $PY $R/docs/bench/grpo_rows.py $OUT/grpo $WORK --shapes ${SHAPES:-llama-1b} \
  --generation ${GENERATION:-transformers+nomerge,compiled,tools:compiled,transformers-static} --repeats ${REPEATS:-1}
echo "rc $?"
$PY - "$OUT/grpo/grpo-rows.json" "${BASE:-transformers+nomerge}" <<'PYEOF'
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
    print(f"GRPO_SPEED {r['shape']} {r['generation']} r{r['repeat']} (sampler {r.get('sampler')}, merged "
          f"{r.get('sampler_merged')}, {r['sampler_args']}) on {r['device']}: step {r['step_s_mean']} s, generate "
          f"{100 * r['generate_share']:.1f}%, {r['generated_tokens_per_s']} gen tok/s, peak {r.get('peak_gib')} GiB")
    if "tools" in r:
        print(f"GRPO_TOOLS {r['shape']} {r['generation']} r{r['repeat']}: prompt {r['settings'].get('prompt_tokens')} "
              f"tokens, per timed step (means) {r['tools'].get('mean') or r['tools']}"
              + (f"; ERROR {r['tools']['error']}" if "error" in r["tools"] else ""))
for shape, gen in sorted(by):
    base, fast = by.get((shape, base_gen)), by[(shape, gen)]
    if base and gen != base_gen and not gen.startswith("tools:"):  # the tool row's prompts differ
        b = statistics.median(x["step_s_mean"] for x in base)
        f = statistics.median(x["step_s_mean"] for x in fast)
        print(f"GRPO_RATIO {shape}: {base_gen} {b:.3f} s/step, {gen} {f:.3f} s/step = {b / f:.2f}x "
              f"(medians of {len(base)} and {len(fast)} rows)")
PYEOF
date -u
# On a GPU the call's rows, logs and host samples (9 files for 4 rows) go back as $OUT/grpo.tgz beside a copy of
# grpo-rows.json: a device call returns at most 8 files, and one over that cost a whole call's files before.
if [ "$DEVICE" = cuda ] && [ -d $OUT/grpo ]; then
  cp $OUT/grpo/grpo-rows.json $OUT/ 2>/dev/null; tar czf $OUT/grpo.tgz -C $OUT grpo --remove-files
fi
