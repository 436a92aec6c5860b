"""The clock of vision_rows.py's rows (issues 40, 44): every row's settings and timed window, the Trainer rows' Clock
(tokens and seconds of the timed steps, memory at the start and after step 1), MEMTRACE=1's peak of steps 1-2 by
allocation site (`peak_sites`), the peak of a row (`_peak`), PROFILE=1's profiler (`PROF`) and HOSTSPY=1's sampler
(`SPY`, host_spy.py).

`PROF` and `SPY` live here only: vision_rows.one() sets them, the Clock and the bare loop (vision_refs.py) read them
through this module, so the row that starts one and the code that steps it see the same one.
"""

from __future__ import annotations

import os
import time

# every row's settings (finetune's config and the references read the same) and the window timed
BATCH, R, LR = 4, 16, 1e-4
WARMUP, TIMED = 4, int(os.environ.get("VR_TIMED", 16))  # VR_TIMED: a longer window than a loader prefetches

# MEMTRACE=1: the allocations of steps 1-2 recorded (torch.cuda.memory._record_memory_history) and the memory
# live at their highest point summed by the first frame outside torch: what a peak is made of.
MEMTRACE = os.environ.get("MEMTRACE") == "1"
PROF = None  # PROFILE=1: vision_rows.one() sets a step_profile.StepProfiler (read as vision_clock.PROF)
SPY = None  # HOSTSPY=1: vision_rows.one() sets a host_spy.Spy over the timed window (read as vision_clock.SPY)
MAX_ENTRIES = 1_000_000
OWN = ("/torch/", "/contextlib.py", "/functools.py")


def attn_impl(model) -> dict:
    """The attention implementation the model runs, of its config and of its text and vision configs."""
    cfg = model.config
    subs = {"model": cfg, "text": getattr(cfg, "text_config", None), "vision": getattr(cfg, "vision_config", None)}
    return {k: getattr(c, "_attn_implementation", None) for k, c in subs.items() if c is not None}


class Clock:
    """Tokens and time of the timed steps of a Trainer row: the tokens each training_step saw (non-padding,
    summed on the device), the time from the end of step WARMUP to the end of the last (one sync at each)."""

    def __init__(self):
        self.toks, self.t0, self.t1, self.mem_at_start, self.param_bytes, self.attn = [], None, None, None, {}, None
        self.after_step1, self.traced_from, self.memtrace = None, 0, None

    def wrap(self, trainer):
        step = trainer.training_step

        def training_step(model, inputs, *a, **kw):
            if trainer.state.global_step >= WARMUP:
                self.toks.append(inputs["attention_mask"].sum())
            return step(model, inputs, *a, **kw)

        trainer.training_step = training_step
        return trainer

    def callback(self):
        import torch
        from transformers import TrainerCallback

        clock = self

        class C(TrainerCallback):
            def on_train_begin(self, args, state, control, model=None, **kw):
                clock.start(model)
                if MEMTRACE and torch.cuda.is_available():  # warm-up steps only: the timed ones run untraced
                    clock.traced_from = torch.cuda.memory_allocated()
                    torch.cuda.memory._record_memory_history(max_entries=MAX_ENTRIES, stacks="python")

            def on_step_end(self, args, state, control, **kw):
                if state.global_step in (1, WARMUP, WARMUP + TIMED) and torch.cuda.is_available():
                    torch.cuda.synchronize()
                if state.global_step == 1 and torch.cuda.is_available():  # what stays (optimizer states) and the peak
                    clock.after_step1 = [round(torch.cuda.memory_allocated() / 2**30, 3), _peak()]
                if state.global_step == 2 and MEMTRACE and torch.cuda.is_available():
                    snap = torch.cuda.memory._snapshot()
                    torch.cuda.memory._record_memory_history(enabled=None)
                    clock.memtrace = peak_sites(snap["device_traces"][0], clock.traced_from)
                if PROF and state.global_step in (WARMUP - 2, WARMUP):  # after MEMTRACE's steps, before the clock's
                    (PROF.start if state.global_step == WARMUP - 2 else PROF.stop)()
                if state.global_step == WARMUP:
                    if SPY:  # started before the clock reads: its start-up is not in the timed window
                        SPY.start()
                    clock.t0 = time.perf_counter()
                if state.global_step == WARMUP + TIMED:
                    clock.t1 = time.perf_counter()
                    if SPY:
                        SPY.stop()

        return C()

    def start(self, model):
        import torch

        self.attn = attn_impl(model)
        if torch.cuda.is_available():
            self.mem_at_start = round(torch.cuda.memory_allocated() / 2**30, 3)
        for prm in model.parameters():
            k = f"{prm.dtype}".replace("torch.", "") + ("-trainable" if prm.requires_grad else "")
            self.param_bytes[k] = self.param_bytes.get(k, 0) + prm.numel() * prm.element_size()

    def row(self, tokens: int | None = None) -> dict:
        tokens = int(sum(int(t) for t in self.toks)) if tokens is None else tokens
        return {"tokens_per_s": tokens / (self.t1 - self.t0), "timed_tokens": tokens, "mem_at_start_gib":
                self.mem_at_start, "attn": self.attn, "after_step1_alloc_peak_gib": self.after_step1, "param_gib": {k: round(v / 2**30, 3) for k, v in self.param_bytes.items()},
                **({"memtrace": self.memtrace} if self.memtrace else {})}


def _site(frames: list[dict]) -> str:
    for f in frames:
        name = f.get("filename", "")
        if name.endswith(".py") and not any(o in name for o in OWN):
            short = name.split("site-packages/")[-1].split("entrypoints/")[-1]
            return f"{short}:{f.get('line')} {f.get('name')}"
    return "torch"


def peak_sites(trace: list[dict], before: int, top: int = 30) -> dict:
    """The highest point of the traced allocations (on top of `before` bytes allocated when tracing began) and
    what was live there, summed by allocation site."""
    cur, best, at = 0, 0, -1
    freed = ("free_requested", "free_completed")
    live: dict = {}
    for i, e in enumerate(trace):  # pass 1: where the peak is
        if e["action"] == "alloc":
            live[e["addr"]] = e["size"]
            cur += e["size"]
            if cur > best:
                best, at = cur, i
        elif e["action"] in freed and e["addr"] in live:
            cur -= live.pop(e["addr"])
    live = {}
    for e in trace[:at + 1]:  # pass 2: what is live there
        if e["action"] == "alloc":
            live[e["addr"]] = e
        elif e["action"] in freed:
            live.pop(e["addr"], None)
    sites: dict = {}
    for e in live.values():
        k = _site(e.get("frames", []))
        n, c = sites.get(k, (0, 0))
        sites[k] = (n + e["size"], c + 1)
    ranked = sorted(sites.items(), key=lambda kv: -kv[1][0])[:top]
    return {"before_gib": round(before / 2**30, 3), "traced_peak_gib": round((before + best) / 2**30, 3),
            "events": len(trace), "truncated": len(trace) >= MAX_ENTRIES,
            "sites": [[k, round(n / 2**30, 4), c] for k, (n, c) in ranked]}


def _peak() -> float | None:
    import torch

    return round(torch.cuda.max_memory_allocated() / 2**30, 3) if torch.cuda.is_available() else None
