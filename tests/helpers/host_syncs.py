"""Count the host syncs of finetune's training steps on the CPU (issue 26).

On a GPU each of these ops stops the host until the device has caught up (a value read back, or an
output whose size depends on the data), so the kernels queued after it start from an empty queue.
On the CPU the same ops go through the same dispatcher, so a TorchDispatchMode sees every one of
them (only their cost differs). `.tolist()` and `.numpy()` read the tensor's memory without an
aten op: they are counted at the Python level.

`step_syncs(cfg)` runs `finetune.run` in-process under the mode, TRL's fused LM-head path on (its
kernel the torch stand-in of objectives/logprob.py, as `bench host-overhead --fused-head torch`),
and returns one record per optimizer step: the step, whether it logged, and each sync as
(op, origin), origin the innermost file:line outside torch (with the autograd node in a backward).
A window runs from the batch fetch of a step (Trainer.get_batch_samples) to that of the next, so a
step holds its forward, loss, backward, clipping, optimizer and scheduler step, callbacks and its
log or checkpoint.
"""

from __future__ import annotations

import contextlib
import os
import traceback
from collections import Counter

import torch
from torch.utils._python_dispatch import TorchDispatchMode

aten = torch.ops.aten
# Ops that read a device value on the host, or whose output size depends on the data (nonzero & co.).
SYNC_OPS = {
    aten._local_scalar_dense.default: "item",  # .item(), float(), int(), bool(), `if t:`
    aten.nonzero.default: "nonzero",
    aten.masked_select.default: "masked_select",
    aten.equal.default: "equal",
    aten.repeat_interleave.Tensor: "repeat_interleave",
    aten._unique2.default: "unique",
    aten.unique_consecutive.default: "unique",
    aten.unique_dim.default: "unique",
    aten.bincount.default: "bincount",
}
MASK_INDEX_OPS = {aten.index.Tensor: "bool-mask index", aten.index_put.default: "bool-mask index_put",
                  aten.index_put_.default: "bool-mask index_put", aten._index_put_impl_.default: "bool-mask index_put"}
PY_READS = ("tolist", "numpy")

_TORCH = os.path.dirname(torch.__file__)
_HERE = os.path.abspath(__file__)


def _short(path: str) -> str:
    for mark in ("site-packages/", "entrypoints/", "tests/"):
        i = path.rfind(mark)
        if i >= 0:
            return path[i + len(mark) if mark == "site-packages/" else i:]
    return path


def origin() -> str:
    """The innermost frame outside torch and this file; in a backward, with the autograd node."""
    where = "?"
    for fr in reversed(traceback.extract_stack()):
        f = os.path.abspath(fr.filename)
        if f.startswith(_TORCH) or f == _HERE or "/torch/" in f:
            continue
        where = f"{_short(f)}:{fr.lineno}"
        break
    node = torch._C._current_autograd_node()
    return f"{where} (backward: {type(node).__name__})" if node is not None else where


def _is_mask(x) -> bool:
    return isinstance(x, torch.Tensor) and x.dtype in (torch.bool, torch.uint8)


class SyncCounter(TorchDispatchMode):
    """Records (op, origin) of each host-syncing op into `self.sink` while it is a list."""

    def __init__(self):
        super().__init__()
        self.sink: list | None = None

    def record(self, name: str) -> None:
        if self.sink is not None:
            self.sink.append((name, origin()))

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if self.sink is not None:
            if func in SYNC_OPS:
                self.record(SYNC_OPS[func])
            elif func in MASK_INDEX_OPS and any(_is_mask(i) for i in (args[1] or ())):
                self.record(MASK_INDEX_OPS[func])
        return func(*args, **kwargs)


@contextlib.contextmanager
def _python_reads(counter: SyncCounter):
    saved = {n: getattr(torch.Tensor, n) for n in PY_READS}

    def wrap(name, fn):
        def read(self, *a, **kw):
            counter.record(name)
            return fn(self, *a, **kw)
        return read

    for n, fn in saved.items():
        setattr(torch.Tensor, n, wrap(n, fn))
    try:
        yield
    finally:
        for n, fn in saved.items():
            setattr(torch.Tensor, n, fn)


def step_syncs(cfg: dict, overrides=(), fused_head: bool = True) -> tuple[list[dict], dict]:
    """Run finetune with `cfg` (a dict as finetune.run takes) and return (steps, summary)."""
    from transformers import TrainerCallback

    from toolbox_train.bench.host import torch_fused_head
    from toolbox_train.commands import finetune
    from toolbox_train.objectives.sft import trainer as sft_trainer

    counter = SyncCounter()
    steps: list[dict] = []

    class Marks(TrainerCallback):
        def on_log(self, args, state, control, logs=None, **kw):
            if steps and counter.sink is not None and logs and "loss" in logs:
                steps[-1]["log"] = True

        def on_step_end(self, args, state, control, **kw):
            if steps:
                steps[-1]["step"] = state.global_step

        def on_train_end(self, args, state, control, **kw):
            counter.sink = None

    orig = sft_trainer.ToolboxSFTTrainer.get_batch_samples

    def get_batch_samples(self, *a, **kw):
        steps.append({"step": None, "log": False, "syncs": []})
        counter.sink = steps[-1]["syncs"]
        return orig(self, *a, **kw)

    sft_trainer.ToolboxSFTTrainer.get_batch_samples = get_batch_samples
    try:
        with torch_fused_head() if fused_head else contextlib.nullcontext(), _python_reads(counter), counter:
            summary = finetune.run(cfg, overrides=list(overrides), overwrite=True, callbacks=[Marks()])
    finally:
        sft_trainer.ToolboxSFTTrainer.get_batch_samples = orig
        counter.sink = None
    return [s for s in steps if s["step"] is not None], summary


def table(syncs: list) -> Counter:
    """(op, origin) -> how many times, for one step's list."""
    return Counter(syncs)


def main(argv=None) -> int:
    """Print each step's syncs: `PYTHONPATH=tests:entrypoints python -m helpers.host_syncs WORKDIR
    [--method lora|full] [--set k=v ...]` (a tiny llama, 6 steps, logging_steps 3: logs at 1, 3, 6)."""
    import argparse
    import os
    from pathlib import Path

    from helpers.tiny import make_tiny_model, train_config, write_dataset

    ap = argparse.ArgumentParser(prog="host_syncs")
    ap.add_argument("workdir", type=Path)
    ap.add_argument("--method", default="lora", choices=["lora", "full"])
    ap.add_argument("--set", dest="sets", action="append", default=[])
    a = ap.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    model = a.workdir / "model"
    if not (model / "config.json").exists():
        make_tiny_model(model, "llama")
    data = write_dataset(a.workdir / "data.jsonl", "text", 48)
    cfg = train_config(model, data, a.workdir / f"out-{a.method}", method=a.method,
                       **{"train.max_steps": 6, "output.logging_steps": 3})
    steps, _ = step_syncs(cfg, a.sets)
    for s in steps:
        print(f"step {s['step']}{' (log)' if s['log'] else ''}: {len(s['syncs'])} syncs")
        for (op, where), n in table(s["syncs"]).most_common():
            print(f"  {n} x {op:20s} {where}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
