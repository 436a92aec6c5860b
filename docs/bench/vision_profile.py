"""Why a vision-language LoRA row runs slower with Liger on (issue 44): finetune on vision_rows.py's shapes with
Liger off, on, and on with one kernel family left out at a time (transformers' liger_kernel_config), each in its
own process; per step: the wall time, the forward+backward time (synchronised) and how many Triton kernels were
compiled (new entries in a fresh TRITON_CACHE_DIR); for `on`, a torch.profiler table of two more steps.

    python docs/bench/vision_profile.py OUT [--shapes gemma3-4b-4l,qwen2.5-vl-7b-4l] [--variants off,on,...]

Rows go to OUT/vision-profile.json (one line each on stdout); profiler tables to OUT/profile-SHAPE-VARIANT.txt.
SHAPE `tiny` runs the plumbing on CPU (Liger needs a GPU: only `off` there).
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE)]
import vision_rows as vr  # noqa: E402  (the shapes, the models and the data)

STEPS = 8  # 2 warm-up, then timed
WARM = 2
# name -> (train keys, liger_kernel_config); the kernel families by the names Liger's apply_* functions take
VARIANTS = {
    "off": ({"liger": False}, None),
    "on": ({"liger": True}, None),
    "on-head-trl": ({"liger": True, "lm_head_kernel": "trl"}, None),
    "on-no-rope": ({"liger": True}, {"rope": False}),
    "on-no-norm": ({"liger": True}, {"rms_norm": False, "layer_norm": False}),
    "on-no-glu": ({"liger": True}, {"geglu": False, "swiglu": False}),
    "on-rope-only": ({"liger": True}, {"rms_norm": False, "layer_norm": False, "geglu": False, "swiglu": False}),
}


def _liger_subset(kernels: dict | None) -> None:
    """Trainer applies Liger with args.liger_kernel_config: pass only the keys the model family's function takes."""
    if kernels is None:
        return
    import inspect

    import transformers.trainer as tr
    from liger_kernel.transformers import monkey_patch

    apply = tr.apply_liger_kernel

    def subset(model, cfg):
        base = getattr(model, "get_base_model", lambda: model)()
        fn = monkey_patch.MODEL_TYPE_TO_APPLY_LIGER_FN[base.config.model_type]
        names = inspect.signature(fn).parameters
        return apply(model, {**(cfg or {}), **{k: v for k, v in kernels.items() if k in names}})

    tr.apply_liger_kernel = subset


def one(out: Path, shape: str, variant: str) -> dict:
    import torch
    from transformers import TrainerCallback

    from toolbox_train.commands import finetune

    gpu = torch.cuda.is_available()
    keys, kernels = VARIANTS[variant]
    _liger_subset(kernels)
    model = vr.make_model(shape, out / f"model-{shape}")
    data = vr.make_data(out / f"data-{shape}" / "train.jsonl", vr.SHAPES[shape][2])
    cache = Path(os.environ["TRITON_CACHE_DIR"])
    prof_at = STEPS  # two more steps, profiled

    class Clock(TrainerCallback):
        def __init__(self):
            self.rows, self.t, self.prof = [], None, None

        def on_step_begin(self, args, state, control, **kw):
            if gpu:
                torch.cuda.synchronize()
            if state.global_step == prof_at and variant == "on":
                acts = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA] if gpu else [])
                self.prof = torch.profiler.profile(activities=acts)
                self.prof.start()
            self.t = time.perf_counter()

        def on_step_end(self, args, state, control, **kw):
            if gpu:
                torch.cuda.synchronize()
            self.rows.append({"step": state.global_step, "s": round(time.perf_counter() - self.t, 4),
                              "triton_cache": sum(1 for _ in cache.iterdir()) if cache.is_dir() else 0})
            if self.prof is not None and state.global_step == prof_at + 2:
                self.prof.stop()
                ka = self.prof.key_averages()
                txt = ka.table(sort_by="self_cuda_time_total" if gpu else "self_cpu_time_total", row_limit=40)
                txt += "\n\n" + ka.table(sort_by="self_cpu_time_total", row_limit=25)
                (out / f"profile-{shape}-{variant}.txt").write_text(txt)
                self.prof = None

    clock = Clock()
    cfg = {"model": {"path": str(model)}, "data": {"path": str(data), "max_seq_length": vr.SHAPES[shape][3]},
           "method": "lora", "backend": "hf", "lora": {"r": vr.R, "alpha": 2 * vr.R, "dropout": 0.0},
           "vision": {"train": ["language"]},
           "train": {"max_steps": STEPS + (2 if variant == "on" else 0), "per_device_batch_size": vr.BATCH,
                     "learning_rate": vr.LR, "lr_scheduler": "constant", "warmup_steps": 0,
                     "precision": "bf16" if gpu else "fp32", "gradient_checkpointing": False, "seed": 0, **keys},
           "output": {"dir": str(out / f"run-{shape}-{variant}"), "save_steps": 0, "progress_bar": False,
                      "save": "adapter"}}
    finetune.run(cfg, overwrite=True, callbacks=[clock])
    steps = [json.loads(x) for x in (out / f"run-{shape}-{variant}" / "metrics.jsonl").read_text().splitlines()]
    toks = [b["tokens"] - a["tokens"] for a, b in zip(steps, steps[1:])]
    timed = clock.rows[WARM:STEPS]
    n_tok = sum(toks[WARM - 1:STEPS - 1])
    return {"shape": shape, "variant": variant, "train": keys, "kernels": kernels,
            "tokens_per_s": n_tok / sum(r["s"] for r in timed), "steps": clock.rows,
            "peak_gib": max(s.get("peak_mem_gib") or 0 for s in steps)}


def main(argv: list[str]) -> int:
    out = Path(argv[0])
    out.mkdir(parents=True, exist_ok=True)
    if "--one" in argv:
        i = argv.index("--one")
        print(json.dumps(one(out, argv[i + 1], argv[i + 2])))
        return 0
    opt = dict(zip(argv[1::2], argv[2::2]))
    rows = []
    for shape in opt.get("--shapes", "gemma3-4b-4l,qwen2.5-vl-7b-4l").split(","):
        for variant in opt.get("--variants", ",".join(VARIANTS)).split(","):
            log = out / f"profile-{shape}-{variant}.log"
            env = {**os.environ, "PYTHONUNBUFFERED": "1", "TRITON_CACHE_DIR": tempfile.mkdtemp(prefix="triton-")}
            row = vr.in_process(__file__, out, shape, "variant", variant, log, env)
            rows.append(row)
            print(json.dumps({k: v for k, v in row.items() if k != "steps"}), flush=True)
            (out / "vision-profile.json").write_text(json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
