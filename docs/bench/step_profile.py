"""PROFILE=1 for vision_rows.py (issue 44): torch.profiler over two warm-up steps of a row, summed compactly for the
row's json, the full key_averages tables (.txt) and every entry (.json) written beside the row's log (what a
device call brings back).

    prof = StepProfiler(Path("OUT/profile-SHAPE-PATH.txt")); prof.start(); ...two steps...; prof.stop()
    row["profile"] = prof.summary
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

TOP = 25
STACKS = os.environ.get("PROFILE_STACKS") == "1"  # and where each sync is called from (the .txt's last table)
CASTS = ("aten::to", "aten::_to_copy", "aten::copy_")
# what makes the host wait for the GPU (a step that syncs cannot queue the next one's kernels behind this one's)
SYNCS = ("aten::item", "aten::_local_scalar_dense", "aten::nonzero", "cudaStreamSynchronize", "cudaDeviceSynchronize",
         "cudaMemcpyAsync")


class StepProfiler:
    """One window of steps, profiled on the CPU and, where there is one, the GPU; `summary` once stopped."""

    def __init__(self, table: Path):
        self.table, self.prof, self.t0, self.summary = table, None, None, None

    def start(self) -> None:
        import torch

        gpu = torch.cuda.is_available()
        acts = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA] if gpu else [])
        if gpu:
            torch.cuda.synchronize()  # the window holds only its own steps' kernels
        self.prof = torch.profiler.profile(activities=acts, with_stack=STACKS)
        self.prof.start()
        self.t0 = time.perf_counter()

    def stop(self) -> None:
        import torch

        if torch.cuda.is_available():
            torch.cuda.synchronize()
        wall = time.perf_counter() - self.t0
        self.prof.stop()
        ka = self.prof.key_averages()
        # device entries (kernels, memcpy, memset) by their own time: their sum is the GPU's busy time (a triton
        # kernel launched outside any aten op, as Liger's forwards are, shows only here); ops by self CPU time
        dev = [e for e in ka if str(e.device_type) != "DeviceType.CPU"]
        ops = [e for e in ka if str(e.device_type) == "DeviceType.CPU"]

        def top(events, attr):
            ranked = sorted(events, key=lambda e: -getattr(e, attr))[:TOP]
            return [[e.key[:100], round(getattr(e, attr) / 1e3, 3), e.count] for e in ranked if getattr(e, attr) > 0]

        self.summary = {"wall_s": round(wall, 4),
                        "device_busy_s": round(sum(e.self_device_time_total for e in dev) / 1e6, 4),
                        "top_device": top(dev, "self_device_time_total"),
                        "top_cpu": top(ops, "self_cpu_time_total"),
                        "casts": {e.key: e.count for e in ops if e.key in CASTS},
                        "syncs": {e.key: [e.count, round(e.self_cpu_time_total / 1e3, 3)] for e in ops if e.key in SYNCS}}
        sort = "self_cuda_time_total" if torch.cuda.is_available() else "self_cpu_time_total"
        text = f"wall {wall:.4f} s over the profiled steps\n\n" + ka.table(sort_by=sort, row_limit=60)
        if torch.cuda.is_available():
            text += "\n\nby self CPU time\n" + ka.table(sort_by="self_cpu_time_total", row_limit=40)
        if STACKS:
            text += "\n\nsyncs by call site (count, op, innermost Python frames)\n" + sync_sites(self.prof)
        self.table.parent.mkdir(parents=True, exist_ok=True)
        self.table.write_text(text)
        # every entry (name, count, self CPU ms, self device ms): what two rows' op sets are compared on
        self.table.with_suffix(".json").write_text(json.dumps(
            [[e.key, e.count, round(e.self_cpu_time_total / 1e3, 3), round(e.self_device_time_total / 1e3, 3)]
             for e in sorted(ka, key=lambda e: -e.self_cpu_time_total - e.self_device_time_total)]))
        self.prof = None


def sync_sites(prof) -> str:
    """Each host-device sync op of the window by the Python frames it was called from (the innermost 4)."""
    from collections import Counter

    sites = Counter()
    for e in prof.events():
        if e.name in SYNCS:
            frames, up = list(e.stack or []), e.cpu_parent
            while up is not None and len(frames) < 12:  # torch 2.13: the frames are the event's parents, not .stack
                frames.append(up.name)
                up = up.cpu_parent
            frames = [f for f in frames if ".py(" in f and "/torch/" not in f][:4]
            sites[(e.name, " < ".join(frames))] += 1
    return "\n".join(f"{n:6d}  {op}  {where}" for (op, where), n in sites.most_common(40))
