"""Calibrate the memory planner and find finetune's per-step host overhead, on a GPU.

`python -m toolbox_train.bench.calibration memory --out DIR` runs finetune configurations (bench's row
worker, each in its own process, a few steps) several at a time on one GPU: peak memory is
per process (`torch.cuda.max_memory_allocated`), so running them side by side does not change
it. Writes memory.json: each row's measured peak next to the planner's prediction.

`python -m toolbox_train.bench.calibration probe --shape S --variant V --out DIR` runs finetune unsloth lora
with a synchronised per-step timer (as bench's bare loops time themselves), optionally under
torch.profiler and cProfile, to see what a step does on the host.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from toolbox_train import bench
from toolbox_train.disk import atomic_write, write_json
from toolbox_train.models import arithmetic

# (shape, backend, method, gradient checkpointing, batch, seq)
MEMORY_ROWS = [
    ("llama-1b", "hf", "full", True, 8, 2048),
    ("llama-1b", "hf", "full", False, 8, 2048),
    ("llama-1b", "hf", "lora", False, 8, 2048),
    ("llama-1b", "hf", "lora", True, 4, 8192),
    ("llama-1b", "hf", "qlora", True, 8, 2048),
    ("llama-1b", "hf", "lora-8bit", True, 8, 2048),
    ("llama-1b", "unsloth", "lora", "unsloth", 2, 8192),
    ("llama-1b", "unsloth", "qlora", "unsloth", 8, 2048),
    ("llama-1b", "unsloth", "lora", False, 8, 2048),
    ("qwen3-0.6b", "hf", "full", False, 8, 2048),
    ("qwen3-0.6b", "hf", "full", True, 4, 8192),
    ("qwen3-0.6b", "unsloth", "full", "unsloth", 8, 2048),
    ("qwen3-0.6b", "hf", "qlora", False, 8, 2048),
    ("gemma3-1b", "hf", "full", True, 8, 2048),
    ("gemma3-1b", "hf", "lora", False, 8, 2048),
    ("gemma3-1b", "hf", "lora", True, 2, 8192),
    ("gemma3-1b", "unsloth", "lora", "unsloth", 8, 2048),
    ("gemma3-1b", "unsloth", "lora", "unsloth", 2, 8192),
]


def setting_for(backend: str, method: str, gc, batch: int, seq: int, **kw) -> arithmetic.Setting:
    """The planner's view of a finetune run with these fields (finetune's defaults otherwise)."""
    return arithmetic.Setting(method=method, backend=backend, liger=backend == "hf", gradient_checkpointing=gc,
                           batch=batch, seq=seq, optimizer=kw.get("optimizer", "adamw_torch"))


def _row_id(r) -> str:
    shape, backend, method, gc, batch, seq = r
    return f"{shape}/{backend}-{method}-gc={gc}-b{batch}-s{seq}"


def run_memory(out: Path, work: Path, parallel: int, budget_gib: float, rows=MEMORY_ROWS) -> list[dict]:
    out.mkdir(parents=True, exist_ok=True)
    work.mkdir(parents=True, exist_ok=True)
    import torch

    dev = "cuda" if torch.cuda.is_available() else "cpu"
    built: dict = {}
    for shape in dict.fromkeys(r[0] for r in rows):
        mdir = work / f"model-{shape}"
        if not mdir.exists():
            bench.build_model_dir(shape, mdir, dev)
        built[shape] = str(mdir)
    datas: dict = {}
    for shape, *_, seq in rows:
        if (shape, seq) not in datas:
            vocab = min(bench.SHAPES[shape]["vocab_size"], 32768)
            datas[(shape, seq)] = str(bench.write_text_dataset(work / f"data-{shape}-{seq}.jsonl", 64, seq + 16, vocab))
    pending = list(rows)
    running: list = []
    results: list[dict] = []
    while pending or running:
        for item in running[:]:
            r, proc, res_path, pred, t0 = item
            if proc.poll() is None:
                continue
            running.remove(item)
            rec = {"id": _row_id(r), "shape": r[0], "backend": r[1], "method": r[2], "gc": r[3], "batch": r[4],
                   "seq": r[5], "predicted_gib": pred, "rc": proc.returncode, "wall_s": time.time() - t0}
            if proc.returncode == 0 and res_path.exists():
                res = json.loads(res_path.read_text())
                rec.update(measured_gib=res.get("peak_gib"), step_s=res.get("step_s"), versions=res.get("versions"))
            results.append(rec)
            print(f"calibration: {rec['id']}: predicted {pred:.2f} GiB, measured {rec.get('measured_gib')} rc {proc.returncode}",
                  flush=True)
            write_json(out / "memory.json", results)
        in_use = sum(x[3] for x in running)
        while pending and len(running) < parallel:
            r = pending[0]
            shape, backend, method, gc, batch, seq = r
            pred = arithmetic.estimate(arithmetic.Shape.from_config(bench.SHAPES[shape], shape),
                                    setting_for(backend, method, gc, batch, seq)).peak_gib
            if running and in_use + pred * 1.3 > budget_gib:
                break
            pending.pop(0)
            rdir = work / _row_id(r).replace("/", "_")
            rdir.mkdir(parents=True, exist_ok=True)
            spec = {"kind": "finetune", "backend": backend, "method": method, "shape": shape,
                    "options": {"ckpt": gc, "batch": batch}, "label": _row_id(r), "device": dev, "seq": seq,
                    "batch": batch, "warmup": 1, "steps": 2, "model_dir": built[shape], "data": datas[(shape, seq)],
                    "tok_vocab": 32768, "workdir": str(rdir), "lr": {"full": 1e-5, "lora": 2e-4}}
            write_json(rdir / "spec.json", spec)
            log = open(rdir / "log.txt", "w")
            proc = subprocess.Popen([sys.executable, "-m", "toolbox_train.bench", "_row", str(rdir / "spec.json"),
                                     str(rdir / "result.json")], stdout=log, stderr=subprocess.STDOUT)
            running.append((r, proc, rdir / "result.json", pred, time.time()))
            in_use += pred * 1.3
        time.sleep(1)
    return results


# ---------------------------------------------------------------------------------- probe


def run_probe(shape: str, variant: str, out: Path, work: Path, warmup: int, steps: int, profile: bool,
              backend: str = "unsloth", method: str = "lora", batch: int = 8, seq: int = 2048) -> dict:
    """finetune with a synchronised step timer; variants switch off one piece of per-step work each."""
    import torch
    from transformers import TrainerCallback

    from toolbox_train.commands import finetune
    from toolbox_train.objectives.sft import config as sft_config
    from toolbox_train.training import trainer as trainer_mod
    from toolbox_train.bench.environment import versions
    from toolbox_train.bench.rows import run_bare

    out.mkdir(parents=True, exist_ok=True)
    work.mkdir(parents=True, exist_ok=True)
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    sync = torch.cuda.synchronize if dev == "cuda" else (lambda: None)
    mdir = work / f"model-{shape}"
    if not mdir.exists():
        bench.build_model_dir(shape, mdir, dev)
    vocab = min(bench.SHAPES[shape]["vocab_size"], 32768)
    data = bench.write_text_dataset(work / f"data-{shape}-{seq}.jsonl", batch * (warmup + steps) * 2 + 16,
                                    seq + 16, vocab)
    extra = 5 if profile else 0  # profiled steps come after the timed ones
    spec = {"method": method, "backend": backend, "options": {}, "seq": seq, "batch": batch, "warmup": warmup,
            "steps": steps + extra, "lr": {"full": 1e-5, "lora": 2e-4}, "device": dev}
    if variant.startswith("bare"):  # the reference loop on the same model and data, in this process
        spec.update(kind="bare", shape=shape, data=str(data), steps=steps,
                    options={"liger": True} if backend == "hf" else {})
        res = run_bare(spec, str(mdir))
        res.update(shape=shape, variant=variant, backend=backend, method=method, versions=versions())
        write_json(out / f"probe-{shape}-{backend}-{method}-{variant}.json", res)
        print(f"calibration probe {shape} {backend} {method} {variant}: {res['tokens_per_s']:,.0f} tokens/s, "
              f"peak {res['peak_gib']} GiB, steps {res['step_times']}", flush=True)
        return res
    cfg = bench.finetune_config(spec, str(mdir), str(data), str(work / f"out-{variant}"))
    sets = []
    if "nockpt" in variant:
        sets.append("train.gradient_checkpointing=false")
    if "fusedadam" in variant:
        sets.append("train.optimizer=adamw_torch_fused")
    base = lean_trainer(trainer_mod.Trainer) if "lean" in variant else trainer_mod.Trainer
    if "nolog" in variant:
        sets.append(f"output.logging_steps={10 * (warmup + steps)}")
    if "notokens" in variant:  # the Trainer's per-step num_input_tokens_seen (a gather and a sync)
        orig = sft_config.sft_args

        def sft_args(p, dist, *more):
            a = orig(p, dist, *more)
            a.include_num_input_tokens_seen = "no"
            return a

        sft_config.sft_args = sft_args
    times: list[float] = []
    prof_state: dict = {}

    class Timer(TrainerCallback):
        def on_step_begin(self, args, state, control, **kw):
            if state.global_step == 0:
                sync()
                self.t = time.perf_counter()
            if profile and state.global_step == warmup + steps:
                import cProfile

                prof_state["cp"] = cProfile.Profile()
                prof_state["tp"] = torch.profiler.profile(
                    activities=[torch.profiler.ProfilerActivity.CPU]
                    + ([torch.profiler.ProfilerActivity.CUDA] if dev == "cuda" else []),
                    with_stack=False, record_shapes=False)
                prof_state["tp"].__enter__()
                prof_state["cp"].enable()

        def on_step_end(self, args, state, control, **kw):
            sync()
            t = time.perf_counter()
            times.append(t - self.t)
            self.t = t
            if profile and state.global_step == warmup + steps + extra:
                prof_state["cp"].disable()
                prof_state["tp"].__exit__(None, None, None)

    class Timed(base):  # finetune's own Trainer (or the lean variant) with the step timer added
        def __init__(self, *a, callbacks=None, **kw):
            super().__init__(*a, callbacks=[*(callbacks or []), Timer()], **kw)

    trainer_mod.Trainer = Timed
    if dev == "cuda":
        torch.cuda.reset_peak_memory_stats()
    finetune.run(cfg, overrides=sets, overwrite=True)
    tokens = batch * seq
    timed = times[warmup:warmup + steps]
    res = {"shape": shape, "variant": variant, "backend": backend, "method": method, "batch": batch, "seq": seq,
           "step_times": [round(t, 4) for t in times], "tokens_per_s": sum(tokens / t for t in timed) / len(timed),
           "peak_gib": torch.cuda.max_memory_allocated() / arithmetic.GiB if dev == "cuda" else None, "versions": versions()}
    if profile:
        import io
        import pstats

        s = io.StringIO()
        pstats.Stats(prof_state["cp"], stream=s).sort_stats("cumulative").print_stats(60)
        atomic_write(out / f"cprofile-{shape}-{variant}.txt", s.getvalue())
        tp = prof_state["tp"]
        atomic_write(out / f"torchprof-{shape}-{variant}.txt",
            tp.key_averages().table(sort_by="self_cpu_time_total", row_limit=45) + "\n\n"
            + tp.key_averages().table(sort_by="cuda_time_total" if dev == "cuda" else "cpu_time_total", row_limit=25))
    write_json(out / f"probe-{shape}-{backend}-{method}-{variant}.json", res)
    print(f"calibration probe {shape} {variant}: {res['tokens_per_s']:,.0f} tokens/s, peak {res['peak_gib']} GiB, "
          f"steps {res['step_times']}", flush=True)
    return res


def lean_trainer(base):
    """TRL's loss on its fused head, with the entropy/accuracy/token metrics kept on the device until
    the next log (TRL's compute_loss syncs the host four times a step for them)."""
    import torch

    class Lean(base):
        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            plain = (not return_outputs and model.training and self.compute_loss_func is None
                     and getattr(self, "label_smoother", None) is None and self.args.loss_type == "nll"
                     and not self.aux_loss_enabled and "attention_mask" in inputs
                     and inputs["input_ids"].is_cuda)
            if not plain:
                return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
            inputs["use_cache"] = False
            out = model(**inputs, fused_lm_head=True)
            n = out.label_mask.sum() if num_items_in_batch is None else num_items_in_batch
            loss = (-out.log_probs).sum() / torch.as_tensor(n).clamp(min=1)
            if self.args.average_tokens_across_devices and num_items_in_batch is not None:
                loss = loss * self.accelerator.num_processes
            pend = self.__dict__.setdefault("_pending_metrics", [])
            pend.append(torch.stack([out.label_mask.sum().float(), out.entropy.detach().sum().float(),
                                     out.is_top1.sum().float(), inputs["attention_mask"].sum().float()]))
            return loss

        def log(self, logs, start_time=None):
            pend = self.__dict__.pop("_pending_metrics", None)
            if pend:
                tot = self.accelerator.gather_for_metrics(torch.stack(pend).sum(0)).reshape(-1, 4).sum(0)
                valid, ent, corr, ntok = tot.tolist()
                m = self._metrics["train"]
                m["entropy"].append(ent / valid if valid else 0.0)
                m["mean_token_accuracy"].append(corr / valid if valid else 0.0)
                self._total_train_tokens += int(ntok)
                m["num_tokens"] = [self._total_train_tokens]
            return super().log(logs, start_time)

    return Lean


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m toolbox_train.bench.calibration", description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("memory")
    m.add_argument("--out", type=Path, required=True)
    m.add_argument("--workdir", type=Path, required=True)
    m.add_argument("--parallel", type=int, default=4)
    m.add_argument("--budget-gib", type=float, default=110)
    p = sub.add_parser("probe")
    p.add_argument("--shape", default="qwen3-0.6b")
    p.add_argument("--variant", default="default")
    p.add_argument("--backend", default="unsloth")
    p.add_argument("--method", default="lora")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--workdir", type=Path, required=True)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--profile", action="store_true")
    a = ap.parse_args(argv)
    if a.cmd == "memory":
        run_memory(a.out, a.workdir, a.parallel, a.budget_gib)
    else:
        os.environ.setdefault("UNSLOTH_DISABLE_AUTO_PADDING_FREE", "1")
        if a.backend == "unsloth":
            import unsloth  # noqa: F401  (before transformers/trl/peft)
        run_probe(a.shape, a.variant, a.out, a.workdir, a.warmup, a.steps, a.profile, a.backend, a.method)
    return 0


if __name__ == "__main__":
    sys.exit(main())
