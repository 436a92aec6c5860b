#!/bin/bash
# Issue 24's device call: preference-tuning LoRA rows on one H200 in the cuda stack's versions (TRL 1.15.0,
# transformers 5.17.0, Unsloth 2026.10.9), each row its own process (docs/bench/dpo_rows.py):
#   DPO: finetune (hf) vs TRL's DPOTrainer + PEFT vs the same DPOTrainer under Unsloth, finetune on the
#        Unsloth backend, and finetune QLoRA (hf, 4-bit base);
#   ORPO and KTO: finetune on hf vs on Unsloth (what `backend: auto` should pick for each).
# SHAPES=llama-1b (default) or qwen3-0.6b; OBJECTIVES=dpo,orpo,kto (default). Rows -> $OUT/<objective>-rows.json,
# logs beside them (each trl row names the trainer class, Unsloth's patched one under Unsloth).
# Needs .gpu/site.tgz (../shared/tools/gpu-site.sh) and the code in .gpu/ep (git archive HEAD entrypoints).
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
R=$PWD; mkdir -p /tmp/site; tar -C /tmp/site -xzf $R/.gpu/site.tgz
export PYTHONPATH=$R/.gpu/ep:/tmp/site
date -u; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python3 -c 'import trl, transformers, unsloth; print("trl", trl.__version__, "transformers", transformers.__version__, "unsloth", unsloth.__version__)' 2>&1 | tail -1
end=$(( $(date +%s) + ${LIMIT:-560} ))
for obj in $(echo ${OBJECTIVES:-dpo,orpo,kto} | tr , ' '); do
  paths=finetune,finetune-unsloth
  [ $obj = dpo ] && paths=finetune,trl,trl-unsloth,finetune-unsloth,finetune-qlora
  left=$(( end - $(date +%s) )); [ $left -gt 30 ] || break
  timeout $left python3 $R/docs/bench/dpo_rows.py $OUT/pref --shapes ${SHAPES:-llama-1b} --paths $paths --objective $obj
done
grep -h "trainer class" $OUT/pref/*.log 2>/dev/null
date -u
