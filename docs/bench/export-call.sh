#!/bin/bash
# issue 26, the GPU export record (prepared for one device call; finishes inside 540 s):
#   bash docs/bench/export-call.sh                    # on the device, carry .gpu
# A LoRA fine-tune of the llama-1b bench shape (random init, Llama 3's real 128,256-token BPE vocabulary so
# that llama.cpp's converter recognises the tokenizer) on the hf backend, exported to GGUF f16 + q4_k_m by
# `export-model`, and perplexity of the fine-tuned model as HF vs as q4_k_m GGUF on the same held-out text
# by `evaluate` (both backends: ctx-token chunks, BOS first, each chunk's second half scored). Prints one
# line `EXPORT_RECORD {...}` with every figure, the versions and the date; $OUT gets record.json (that line) and
# files.tgz (each step's JSON and log, finetune's metrics.jsonl).
#  1) the model: bench.synthetic.build_model_dir(SHAPE) with vocab_size = the tokenizer's, then its word-level
#     bench tokenizer replaced by the llama-bpe one (built from llama.cpp's models/ggml-vocab-llama-bpe.gguf by
#     tests/export/vocab.py, checked there against the vendored token ids) and the config's BOS/EOS/PAD ids set
#     to that tokenizer's;
#  2) data: bench.synthetic.write_text_dataset (each row a random 64-word motif repeated, so a random-init model's
#     loss can fall); the held-out text: the same generator, another seed, rows joined by a blank line (.txt);
#  3) finetune (hf backend, LoRA r16 on every projection, bf16), wall time and first/last loss;
#  4) export-model --to gguf --quant f16,q4_k_m (wall time; its export.json: sizes), then --to merged (size
#     of the merged HF model);
#  5) evaluate --runtime hf and evaluate --runtime llama --quant q4_k_m on that text (each: base and
#     fine-tuned); then llama-perplexity (llamacpp.perplexity, evaluate's own function) on the fine-tuned
#     f16 GGUF, so the q4_k_m delta splits into conversion and quantization.
# Needs .gpu/site.tgz (../shared/tools/gpu-site.sh), .gpu/ep (git archive HEAD entrypoints) and .gpu/llama/
# (llama-tools.tgz: llama.cpp 0c1e57098 from the llama-cpp-python 0.3.36 sdist, CPU, AVX2, static, in
# /opt/llama.cpp's layout; sp-site.tgz: sentencepiece for the converter; tok-llama-bpe.tgz: the tokenizer).
# llama.cpp runs on the CPU (as in the cuda image), and so do export-model's merge and evaluate --runtime hf
# (they load the model on the CPU; evaluate in fp32).
# CPU dry run (tiny shape): SHAPE=tiny-llama DEVICE=cpu STEPS=30 BATCH=2 SEQ=256 WORDS=120 N_EVAL=8 CTX=128 \
#   OUT=/tmp/out PY=.venv/bin/python SITE= SPTGZ= W=/tmp/exprec-dry LCPP=/tmp/exprec-dry-lcpp bash docs/bench/export-call.sh
set -u
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
SHAPE=${SHAPE:-llama-1b}; DEVICE=${DEVICE:-cuda}; STEPS=${STEPS:-300}; BATCH=${BATCH:-8}; SEQ=${SEQ:-1024}
WORDS=${WORDS:-480}; N_TRAIN=${N_TRAIN:-800}; N_EVAL=${N_EVAL:-6}; CTX=${CTX:-512}; LR=${LR:-1e-3}
LIMIT=${LIMIT:-535}
T0=$(date +%s); DEADLINE=$((T0 + LIMIT))
left() { local n=$((DEADLINE - $(date +%s))); [ $n -gt 1 ] && echo $n || echo 1; }
R=$PWD; W=${W:-/tmp/exprec}; OUT=${OUT:-/tmp/exprec-out}; O=$W-files  # $OUT gets record.json + files.tgz of $O
PY=${PY:-python3}; SITE=${SITE-/tmp/site}; LCPP=${LCPP:-/tmp/llama.cpp}  # a dry run here: PY=.venv/bin/python SITE=
rm -rf $W $O $LCPP; mkdir -p $LCPP $W $O $OUT
[ -n "$SITE" ] && { mkdir -p $SITE; tar -C $SITE -xzf $R/.gpu/site.tgz; }
tar -C $LCPP -xzf ${LTGZ:-$R/.gpu/llama/llama-tools.tgz}
tar -C $W -xzf $R/.gpu/llama/tok-llama-bpe.tgz
# sentencepiece 0.2.3 (cp312 wheel, the stacks' llama_cpp.sentencepiece pin): llama.cpp's Llama converter imports it
# before it looks for tokenizer.model, so without it even a BPE (Llama 3) tokenizer fails to convert
SPTGZ=${SPTGZ-$R/.gpu/llama/sp-site.tgz}
[ -n "$SPTGZ" ] && { mkdir -p $LCPP/site; tar -C $LCPP/site -xzf $SPTGZ; }
export PYTHONPATH=$R/.gpu/ep${SITE:+:$SITE}${SPTGZ:+:$LCPP/site} LLAMA_CPP_DIR=$LCPP/tools
date -u
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null
echo "nproc $(nproc); $(grep -m1 'model name' /proc/cpuinfo)"; echo "PYTHONPATH=$PYTHONPATH LLAMA_CPP_DIR=$LLAMA_CPP_DIR"
# every figure goes into $O/*.json as it is made; the summary line is printed whatever step fails or runs out
summary() {
  $PY - "$W" "$O" "$SHAPE" "$T0" "$LCPP" <<'EOF'
import json, os, sys, time, datetime, subprocess, importlib.metadata as md
W, OUT, shape, t0, lcpp = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5]
def j(name):
    try:
        return json.load(open(os.path.join(OUT, name)))
    except (OSError, ValueError):
        return None
def ver(p):
    try:
        return md.version(p)
    except md.PackageNotFoundError:
        return None
rec = {"date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"), "shape": shape}
rec.update(j("setup.json") or {})
ft = j("finetune-summary.json") or {}
times = j("times.json") or {}
rec["finetune"] = {k: ft.get(k) for k in ("steps", "first_loss", "last_loss", "wall_s", "tokens", "tokens_per_s",
                                          "peak_mem_gib") if k in ft} | {"command_wall_s": times.get("finetune")}
try:  # the logged losses (every logging_steps), from finetune's metrics.jsonl
    rec["finetune"]["loss_curve"] = [[m["step"], round(m["loss"], 3)] for m in map(json.loads, open(
        os.path.join(OUT, "metrics.jsonl"))) if "loss" in m]
except (OSError, ValueError, KeyError):
    pass
eg = j("export-gguf.json") or {}
em = j("export-merged.json") or {}
rec["export"] = {"gguf_wall_s": times.get("export_gguf"), "gguf_seconds": eg.get("seconds"),
                 "files": {f["path"]: f["bytes"] for f in eg.get("files", [])},
                 "merged_wall_s": times.get("export_merged"),
                 "merged_bytes": sum(f["bytes"] for f in em.get("files", [])) or None,
                 "llama_cpp": eg.get("llama_cpp")}
hf, q4, f16 = j("eval-hf.json"), j("eval-q4_k_m.json"), j("ppl-f16.json")
ppl = {"ctx": (hf or q4 or {}).get("ctx"), "text_tokens": (hf or q4 or {}).get("text_tokens")}
for name, r in (("hf", hf), ("gguf_q4_k_m", q4)):
    if r:
        ppl[name] = {"base": r["base"]["ppl"], "finetuned": r["finetuned"]["ppl"],
                     "scored_tokens": r["finetuned"].get("scored_tokens")}
if f16:
    ppl["gguf_f16_finetuned"] = f16["ppl"]
if hf and q4:
    a, b = hf["finetuned"]["ppl"], q4["finetuned"]["ppl"]
    ppl["q4_k_m_vs_hf_finetuned"] = {"delta": b - a, "delta_pct": 100 * (b - a) / a}
    a, b = hf["base"]["ppl"], q4["base"]["ppl"]
    ppl["q4_k_m_vs_hf_base"] = {"delta": b - a, "delta_pct": 100 * (b - a) / a}
if hf and f16:
    a = hf["finetuned"]["ppl"]
    ppl["f16_vs_hf_finetuned"] = {"delta": f16["ppl"] - a, "delta_pct": 100 * (f16["ppl"] - a) / a}
try:  # export's phases, from the times of its own step lines (1 s resolution)
    marks = {}
    for line in open(os.path.join(OUT, "log-export-gguf.txt")):
        t, _, msg = line.partition(" ")
        for key, pat in (("merge", "step 1:"), ("convert", "step 2:"), ("quantize", "step 3.1/"),
                         ("end", "wrote model-q4_k_m")):
            if pat in msg and key not in marks:
                marks[key] = int(t)
    rec["export"]["phases_s"] = {"merge_f16": marks["convert"] - marks["merge"],
                                 "convert_f16": marks["quantize"] - marks["convert"],
                                 "quantize_q4_k_m": marks["end"] - marks["quantize"]}
except (OSError, ValueError, KeyError):
    pass
rec["perplexity"] = ppl
rec["times"] = times
rec["versions"] = {"python": sys.version.split()[0]} | {p: ver(p) for p in ("torch", "transformers", "peft", "trl", "accelerate", "datasets",
                                       "safetensors", "tokenizers", "numpy")}
try:
    rec["versions"]["llama_cpp"] = open(os.path.join(lcpp, "tools", "VERSION")).read().strip()
except OSError:
    pass
rec["total_wall_s"] = int(time.time()) - t0
json.dump(rec, open(os.path.join(OUT, "record.json"), "w"), indent=2)
print("EXPORT_RECORD " + json.dumps(rec))
EOF
  cp $O/record.json $OUT/ 2>/dev/null; tar -C $O -czf $OUT/files.tgz .
  date -u
}
trap summary EXIT
stamp() {  # stamp NAME SECONDS: adds one wall time to $O/times.json
  $PY -c "import json,sys,os; f=sys.argv[1]; d=json.load(open(f)) if os.path.exists(f) else {}; \
d[sys.argv[2]]=round(float(sys.argv[3]),1); json.dump(d,open(f,'w'))" $O/times.json "$1" "$2"
}
now() { date +%s.%N; }
tsl() { while IFS= read -r l; do printf '%(%s)T %s\n' -1 "$l"; done; }  # each line with its time (epoch s)
since() { $PY -c "import sys; print(float(sys.argv[2])-float(sys.argv[1]))" "$1" "$(now)"; }

# 1) model + 2) data
t=$(now)
timeout $(left) $PY - "$SHAPE" "$DEVICE" "$W" "$N_TRAIN" "$N_EVAL" "$WORDS" > $O/setup.json <<'EOF' || exit 1
import json, os, shutil, sys
from pathlib import Path
import torch
from transformers import AutoTokenizer
from toolbox_train.bench.shapes import SHAPES
from toolbox_train.bench.synthetic import build_model_dir, write_text_dataset
shape, device, W, n_train, n_eval, words = sys.argv[1], sys.argv[2], Path(sys.argv[3]), *map(int, sys.argv[4:])
tok_dir = W / "tok-llama-bpe"
tok = AutoTokenizer.from_pretrained(tok_dir)
cfg = dict(SHAPES[shape], vocab_size=len(tok))
base = build_model_dir(cfg, W / "base", device=device)
for f in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja"):
    (base / f).unlink(missing_ok=True)
for f in tok_dir.iterdir():
    shutil.copy2(f, base / f.name)
ids = {"bos_token_id": tok.bos_token_id, "eos_token_id": tok.eos_token_id, "pad_token_id": tok.pad_token_id}
for name in ("config.json", "generation_config.json"):
    p = base / name
    if p.exists():
        c = json.loads(p.read_text())
        c.update({k: v for k, v in ids.items() if k in c or name == "config.json"})
        p.write_text(json.dumps(c, indent=2))
# words w4..w999: " w123" is two BPE tokens, so a row of `words` words is about 2 x words tokens
write_text_dataset(W / "train.jsonl", n_train, words, 1000, seed=0)
write_text_dataset(W / "heldout.jsonl", n_eval, words, 1000, seed=1)
rows = [json.loads(l)["text"] for l in open(W / "heldout.jsonl")]
(W / "heldout.txt").write_text("\n\n".join(rows))
n_params = sum(t.numel() for t in __import__("safetensors.torch", fromlist=["load_file"]).load_file(
    str(base / "model.safetensors")).values())
print(json.dumps({"device": torch.cuda.get_device_name(0) if device == "cuda" else "cpu", "params": n_params,
                  "vocab": len(tok), "base_bytes": sum(f.stat().st_size for f in base.iterdir()),
                  "train_rows": n_train, "heldout_rows": n_eval, "words_per_row": words,
                  "heldout_tokens": len(tok("\n\n".join(rows))["input_ids"]),
                  "cpu_count": os.cpu_count(), "affinity": len(os.sched_getaffinity(0))}))
EOF
stamp setup $(since $t); cat $O/setup.json

# 3) finetune
PREC=bf16; [ "$DEVICE" = cpu ] && PREC=fp32
cat > $W/train.yaml <<EOF
model: {path: $W/base}
data: {path: $W/train.jsonl, format: text, max_seq_length: $SEQ}
method: lora
backend: hf
lora: {r: 16, alpha: 16, dropout: 0.0, target_modules: [q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj]}
train: {max_steps: $STEPS, per_device_batch_size: $BATCH, learning_rate: $LR, precision: $PREC, seed: 0}
output: {dir: $W/run, save_steps: 0, logging_steps: 10, progress_bar: false}
EOF
echo "+ finetune --config train.yaml"; cat $W/train.yaml
t=$(now)
timeout $(left) $PY -m toolbox_train.commands.finetune --config $W/train.yaml > $O/log-finetune.txt 2>&1
rc=$?; stamp finetune $(since $t); echo "finetune rc $rc"; tail -3 $O/log-finetune.txt
cp $W/run/summary.json $O/finetune-summary.json 2>/dev/null; cp $W/run/metrics.jsonl $O/ 2>/dev/null
[ $rc = 0 ] || exit 1

# 4) export
echo "+ export-model --run RUN --to gguf --quant f16,q4_k_m --json"
t=$(now)
timeout $(left) $PY -m toolbox_train.export.model --run $W/run --to gguf --quant f16,q4_k_m --json \
  2>&1 > $O/export-gguf.json | tsl > $O/log-export-gguf.txt
rc=${PIPESTATUS[0]}; stamp export_gguf $(since $t); echo "export gguf rc $rc"; grep "export-model:" $O/log-export-gguf.txt
[ $rc = 0 ] || { tail -5 $O/log-export-gguf.txt; exit 1; }

# 5) perplexity: HF (in-process, CPU fp32) and llama.cpp (q4_k_m), base and fine-tuned each
echo "+ evaluate --run RUN --runtime hf --data heldout.txt --ctx $CTX --json"
t=$(now)
timeout $(left) $PY -m toolbox_train.export.evaluate --run $W/run --runtime hf --data $W/heldout.txt \
  --ctx $CTX --out $W/eval-hf.json --json > $O/eval-hf.json 2> $O/log-eval-hf.txt
rc=$?; stamp eval_hf $(since $t); echo "evaluate hf rc $rc"; tail -2 $O/log-eval-hf.txt
echo "+ evaluate --run RUN --runtime llama --quant q4_k_m --data heldout.txt --ctx $CTX --json"
t=$(now)
timeout $(left) $PY -m toolbox_train.export.evaluate --run $W/run --runtime llama --quant q4_k_m \
  --data $W/heldout.txt --ctx $CTX --out $W/eval-q4.json --json > $O/eval-q4_k_m.json 2> $O/log-eval-q4.txt
rc=$?
if [ $rc != 0 ] && grep -q "llama-perplexity" $O/log-eval-q4.txt; then  # the CPU weight repacking, off
  echo "evaluate llama rc $rc; again with LLAMA_ARG_REPACK=0"; tail -2 $O/log-eval-q4.txt
  LLAMA_ARG_REPACK=0 timeout $(left) $PY -m toolbox_train.export.evaluate --run $W/run --runtime llama \
    --quant q4_k_m --data $W/heldout.txt --ctx $CTX --out $W/eval-q4.json --json > $O/eval-q4_k_m.json \
    2>> $O/log-eval-q4.txt
  rc=$?
fi
stamp eval_q4_k_m $(since $t); echo "evaluate llama q4_k_m rc $rc"; tail -2 $O/log-eval-q4.txt
t=$(now)
timeout $(left) $PY - $W <<'EOF' > $O/ppl-f16.json 2> $O/log-ppl-f16.txt
import json, sys
from pathlib import Path
from toolbox_train.export import llamacpp
W = Path(sys.argv[1])
ctx = next((json.load(open(f))["ctx"] for f in (W / "eval-hf.json", W / "eval-q4.json") if f.exists()),
           None)  # the ctx evaluate used (lowered to fit short text)
if ctx is None:
    sys.exit("no evaluate result to take ctx from")
g = W / "run" / "export" / "gguf" / "model-f16.gguf"
print(json.dumps({**llamacpp.perplexity(llamacpp.find_tools(None), g, W / "heldout.txt", ctx), "model": str(g)}))
EOF
rc=$?; stamp ppl_f16 $(since $t); echo "llama-perplexity f16 rc $rc"
echo "+ export-model --run RUN --to merged --json"
t=$(now)
timeout $(left) $PY -m toolbox_train.export.model --run $W/run --to merged --json \
  > $O/export-merged.json 2> $O/log-export-merged.txt
rc=$?; stamp export_merged $(since $t); echo "export merged rc $rc"; tail -1 $O/log-export-merged.txt
