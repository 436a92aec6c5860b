"""Issue 24's GPU rows (waiting for a device call; the GPU is the speed helper's): DPO LoRA on the
llama-1b and qwen3-0.6b shapes, `finetune` against TRL's DPOTrainer + PEFT run directly and the
same DPOTrainer under Unsloth, each in its own process; pairs/s over the timed steps, peak memory.

    python docs/bench/dpo_rows.py OUT [--shapes llama-1b,qwen3-0.6b] [--paths finetune,trl,trl-unsloth,finetune-unsloth]
                                      [--objective dpo|orpo|kto]
    python docs/bench/dpo_rows.py OUT --one SHAPE PATH [OBJECTIVE]   (one row; what the driver runs per process)

PATH: finetune (backend hf), finetune-unsloth, finetune-qlora (hf, 4-bit base), trl (DPOTrainer + PEFT),
trl-unsloth (the same under Unsloth); the trl paths are DPO's only. ORPO reads the same preference rows,
KTO unpaired rows (each pair split into a desirable and an undesirable completion): examples/s counts
pairs for DPO/ORPO and completions for KTO.

Settings as the issue's outside measurement: prompt 512 + completions 512 tokens, batch 4 pairs,
LoRA r16 on all linear layers, bf16, random-init models and word-level data (bench/synthetic.py),
10 warm-up steps then 30 timed. Rows go to OUT/dpo-rows.json and one line each on stdout.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path

PROMPT, COMPLETION, BATCH, WARMUP, TIMED, R = 512, 512, 4, 10, 30, 16
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def _data(path: Path, vocab: int, objective: str, n: int = 512) -> Path:
    rnd = random.Random(0)
    words = lambda k: " ".join(f"w{rnd.randrange(4, min(vocab, 32768))}" for _ in range(k))  # noqa: E731
    rows = [{"prompt": words(PROMPT), "chosen": " " + words(COMPLETION), "rejected": " " + words(COMPLETION)}
            for _ in range(n)]
    if objective == "kto":
        rows = [{"prompt": r["prompt"], "completion": r[k], "label": k == "chosen"} for r in rows
                for k in ("chosen", "rejected")]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


class _Clock:
    """A TrainerCallback timing the steps after the warm-up (CUDA synchronized)."""

    def __new__(cls):
        import torch
        from transformers import TrainerCallback

        class Clock(TrainerCallback):
            t0 = None

            def on_step_end(self, args, state, control, **kw):
                if state.global_step == WARMUP:
                    torch.cuda.synchronize()
                    Clock.t0 = time.perf_counter()

        return Clock()


def one(out: Path, shape: str, path: str, objective: str = "dpo") -> dict:
    import torch

    from toolbox_train.bench.synthetic import build_model_dir

    model_dir = out / f"model-{shape}"
    if not model_dir.exists():
        build_model_dir(shape, model_dir, device="cuda")
    vocab = json.loads((model_dir / "config.json").read_text())["vocab_size"]
    data = out / f"{objective}-{shape}.jsonl"
    if not data.exists():
        _data(data, vocab, objective)
    steps = WARMUP + TIMED
    torch.cuda.reset_peak_memory_stats()
    if path.startswith("finetune"):
        backend = "unsloth" if path == "finetune-unsloth" else "hf"
        method = "qlora" if path == "finetune-qlora" else "lora"
        cfg = {"model": {"path": str(model_dir)}, "objective": objective, "method": method, "backend": backend,
               "data": {"path": str(data), "max_seq_length": PROMPT + COMPLETION},
               "lora": {"r": R, "alpha": 2 * R}, "train": {"max_steps": steps, "per_device_batch_size": BATCH,
                                                          "precision": "bf16", "lr_scheduler": "constant"},
               "output": {"dir": str(out / f"run-{shape}-{objective}-{path}"), "progress_bar": False}}
        from toolbox_train.commands import finetune

        finetune.run(cfg, overwrite=True)
        # metrics.jsonl has each step's tokens and tokens/s since the previous log: the time of a
        # step is their quotient; the timed steps are those after the warm-up
        rows = [json.loads(x) for x in (out / f"run-{shape}-{objective}-{path}" / "metrics.jsonl").read_text().splitlines()]
        wall = sum((b["tokens"] - a["tokens"]) / b["tokens_per_s"] for a, b in zip(rows, rows[1:])
                   if b["step"] > WARMUP)
        pairs_s = BATCH * TIMED / wall
    else:
        assert objective == "dpo", "the trl paths are DPO's"
        if path == "trl-unsloth":
            import unsloth  # noqa: F401  (first: it patches TRL's trainers)
            from unsloth import FastLanguageModel

            model, tok = FastLanguageModel.from_pretrained(str(model_dir), max_seq_length=PROMPT + COMPLETION,
                                                           load_in_16bit=True, load_in_4bit=False,
                                                           dtype=torch.bfloat16)  # 4-bit is its default
            model = FastLanguageModel.get_peft_model(model, r=R, lora_alpha=2 * R, target_modules=TARGETS)
            peft = None
        else:
            from peft import LoraConfig
            from transformers import AutoModelForCausalLM, AutoTokenizer

            model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16, device_map={"": 0})
            tok = AutoTokenizer.from_pretrained(model_dir)
            peft = LoraConfig(r=R, lora_alpha=2 * R, target_modules=TARGETS, task_type="CAUSAL_LM")
        from datasets import load_dataset
        from trl import DPOConfig, DPOTrainer

        args = DPOConfig(output_dir=str(out / f"trl-{shape}-{path}"), per_device_train_batch_size=BATCH,
                         max_steps=steps, bf16=True, max_length=PROMPT + COMPLETION, report_to="none",
                         save_strategy="no", logging_steps=10, disable_tqdm=True, lr_scheduler_type="constant")
        clock = _Clock()
        tr = DPOTrainer(model=model, args=args, processing_class=tok, peft_config=peft, callbacks=[clock],
                        train_dataset=load_dataset("json", data_files=str(data), split="train"))
        print(f"trainer class: {type(tr).__mro__[0].__name__} <- {type(tr).__mro__[1].__name__}", file=sys.stderr)
        tr.train()
        torch.cuda.synchronize()
        pairs_s = BATCH * TIMED / (time.perf_counter() - type(clock).t0)
    return {"shape": shape, "objective": objective, "path": path, "examples_per_s": round(pairs_s, 2),
            "peak_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2)}


def main(argv: list[str]) -> int:
    out = Path(argv[0])
    out.mkdir(parents=True, exist_ok=True)
    if argv[1:2] == ["--one"]:
        print("ROW " + json.dumps(one(out, argv[2], argv[3], *argv[4:5])), flush=True)
        return 0
    opt = dict(zip(argv[1::2], argv[2::2]))
    objective = opt.get("--objective", "dpo")
    rows = []
    for shape in opt.get("--shapes", "llama-1b,qwen3-0.6b").split(","):
        for path in opt.get("--paths", "finetune,trl,trl-unsloth,finetune-unsloth").split(","):
            cp = subprocess.run([sys.executable, __file__, str(out), "--one", shape, path, objective], capture_output=True,
                                text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})
            (out / f"{shape}-{objective}-{path}.log").write_text(cp.stdout + cp.stderr)
            row = next((json.loads(x[4:]) for x in cp.stdout.splitlines() if x.startswith("ROW ")),
                       {"shape": shape, "objective": objective, "path": path, "error": (cp.stderr.strip().splitlines() or ["?"])[-1]})
            print(json.dumps(row), flush=True)
            rows.append(row)
    (out / f"{objective}-rows.json").write_text(json.dumps(rows, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
