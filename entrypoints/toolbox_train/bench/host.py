"""`bench host-overhead`: finetune's per-step host work, on the CPU, against a bare loop.

A model with the layer count of a real shape (so as many tensors and modules as the real one) at a
toy width, on the CPU, trains a few steps in a bare loop (the model, AdamW, a loop over id tensors)
and through `finetune` with each variant's `--set` options, interleaved, a few times over. At this
width a step's arithmetic takes little time, so finetune's step time minus the bare loop's is
almost all host work: the Trainer, TRL, the data loader, the optimizer's launches. It also counts
the host reads of tensor values per step (`.item()`, `.tolist()`, `bool()`, `float()`, `int()` on a
tensor): on a GPU each one stops the host until the device has caught up. Timings from a shared
CPU are noisy: the report gives medians of the repeats, the test checks that both numbers exist
and that the reads are counted, never a timing.

`--vocab N` gives the toy model a real vocabulary (Qwen3's 151,936) and `--fused-head torch` runs
finetune's SFT loss through TRL's fused-head path, as on a GPU (on a CPU finetune otherwise takes the
model's own loss: TRL's kernel is Triton), with the torch stand-in of objectives/logprob.py as the
kernel: then the per-vocabulary work of each `output.step_metrics` mode shows. The stand-in computes
what it is asked for in separate passes over the logits, where TRL's kernel and Unsloth's fold the
entropy and the top-1 into their one pass: a CPU figure is the upper bound of that work, not a GPU's.
"""

from __future__ import annotations

import contextlib
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Sequence

from toolbox_train.disk import atomic_write, write_json
from toolbox_train.bench.measure import load_hf
from toolbox_train.bench.rows import finetune_config
from toolbox_train.bench.synthetic import read_token_batches
from toolbox_train.bench.shapes import BenchError, SHAPES
from toolbox_train.bench.synthetic import build_model_dir, write_text_dataset

TOY_WIDTH = dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                 intermediate_size=128, vocab_size=512)

# Each candidate of issue 26 as the option that turns it back on (or off), from finetune's defaults.
VARIANTS: dict[str, list[str]] = {
    "defaults": [],
    "before-issue-26": ["train.optimizer=adamw_torch", "output.step_metrics=synced", "output.nan_inf_filter=true"],
    "foreach-adamw": ["train.optimizer=adamw_torch"],
    "synced-step-metrics": ["output.step_metrics=synced"],
    "deferred-step-metrics": ["output.step_metrics=deferred"],  # TRL's entropy and top-1 accuracy computed
    "labelled-lm-head": ["train.lm_head_tokens=labelled"],  # TRL's boolean-mask gather (a sync) in the head
    "nan-inf-filter": ["output.nan_inf_filter=true"],
    "no-per-step-logging": ["output.logging_steps=1000000"],
    "no-grad-clipping": ["train.max_grad_norm=0"],
}

FUSED_HEADS = ("model", "torch")
TOY_TOKENIZER_WORDS = 32768  # synthetic.build_tokenizer's word count at most: the data's ids stay below it

_READS = ("item", "tolist", "__bool__", "__float__", "__int__")


@contextlib.contextmanager
def count_reads(counter: list[int]):
    """Count host reads of tensor values (each a device sync on a GPU) while inside."""
    import torch

    saved = {name: getattr(torch.Tensor, name) for name in _READS}

    def wrap(fn):
        def counted(self, *a, **kw):
            # torch.optim's step counters stay on the host even with a GPU: reading them is no sync
            if not sys._getframe(1).f_globals.get("__name__", "").startswith("torch.optim"):
                counter[0] += 1
            return fn(self, *a, **kw)
        return counted

    for name, fn in saved.items():
        setattr(torch.Tensor, name, wrap(fn))
    try:
        yield
    finally:
        for name, fn in saved.items():
            setattr(torch.Tensor, name, fn)


@contextlib.contextmanager
def torch_fused_head():
    """finetune's SFT loss on TRL's fused-head path on the CPU, its kernel the torch stand-in (logprob.py)."""
    from trl.trainer import utils

    from toolbox_train.training import trainer
    from toolbox_train.training.logprob import TorchLogProb

    saved = utils._ChunkedLogProbFunction, trainer.fused_head_ok
    utils._ChunkedLogProbFunction, trainer.fused_head_ok = TorchLogProb, (lambda inputs: True)
    try:
        yield
    finally:
        utils._ChunkedLogProbFunction, trainer.fused_head_ok = saved


def toy_shape(shape: str, vocab: int | None = None) -> dict:
    if shape not in SHAPES:
        raise BenchError(f"--shape: unknown shape {shape!r} (known: {', '.join(SHAPES)})")
    cfg = {**SHAPES[shape], **TOY_WIDTH}
    if vocab:
        cfg["vocab_size"] = vocab
    if "sliding_window" in cfg:
        cfg.update(sliding_window=64, query_pre_attn_scalar=16)
    return cfg


def _step_clock():
    """A finetune callback: wall time between optimizer-step ends, host reads and collation time per step."""
    from transformers import TrainerCallback

    class Clock(TrainerCallback):
        def __init__(self):
            self.times: list[float] = []
            self.cpu: list[float] = []
            self.reads: list[int] = []
            self.collate_s = 0.0
            self.counter = [0]
            self._ctx = None

        def on_train_begin(self, args, state, control, train_dataloader=None, **kw):
            dl = getattr(train_dataloader, "base_dataloader", train_dataloader)  # accelerate's shard wraps it
            if dl is not None:
                inner = dl.collate_fn

                def timed(features):
                    t = time.perf_counter()
                    try:
                        return inner(features)
                    finally:
                        self.collate_s += time.perf_counter() - t

                dl.collate_fn = timed
            self._ctx = count_reads(self.counter)
            self._ctx.__enter__()
            self.t, self.c = time.perf_counter(), time.process_time()
            self.r = 0

        def on_step_end(self, args, state, control, **kw):
            t, c = time.perf_counter(), time.process_time()
            self.times.append(t - self.t)
            self.cpu.append(c - self.c)
            self.reads.append(self.counter[0] - self.r)
            self.t, self.c, self.r = t, c, self.counter[0]

        def on_train_end(self, args, state, control, **kw):
            if self._ctx is not None:
                self._ctx.__exit__(None, None, None)
                self._ctx = None

    return Clock()


def _bare(spec: dict, model_dir: Path) -> dict:
    """bench's bare loop (as rows.run_bare: fused AdamW, id tensors), with the host's CPU time beside the wall time."""
    import torch

    model = load_hf(spec, str(model_dir))
    model.train()
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=spec["lr"]["lora"],
                            weight_decay=0.0, fused=True)
    batches = read_token_batches(spec["data"], spec["batch"], spec["seq"], spec["warmup"] + spec["steps"])
    wall, cpu, counter = [], [], [0]
    with count_reads(counter):
        t, c = time.perf_counter(), time.process_time()
        for ids in batches:
            out = model(input_ids=ids, attention_mask=torch.ones_like(ids), labels=ids)
            out.loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            float(out.loss.detach())
            wall.append(time.perf_counter() - t)
            cpu.append(time.process_time() - c)
            t, c = time.perf_counter(), time.process_time()
    w = spec["warmup"]
    return {"step_s": _mean(wall[w:]), "cpu_s": _mean(cpu[w:]), "reads_per_step": counter[0] / len(wall),
            "collate_s_per_step": 0.0}


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs)


def _finetune(spec: dict, model_dir: Path, data: Path, work: Path, sets: Sequence[str],
              fused_head: str = "model") -> dict:
    from toolbox_train.commands import finetune

    clock = _step_clock()
    cfg = finetune_config(spec, str(model_dir), str(data), str(work / "out"))
    cfg["output"].pop("logging_steps")  # finetune's own default, unless a variant sets it
    # checkpointing off as in the bare loop: finetune's `auto` turns it on on a CPU (no device memory known)
    base = ["train.gradient_checkpointing=false", "output.progress_bar=false"]
    try:
        with torch_fused_head() if fused_head == "torch" else contextlib.nullcontext():
            finetune.run(cfg, overrides=[*base, *sets], overwrite=True, callbacks=[clock])
    finally:
        clock.on_train_end(None, None, None)  # the tensor methods restored even if the run failed
    w = spec["warmup"]
    if len(clock.times) <= w:
        raise RuntimeError("finetune recorded no timed step")
    return {"step_s": _mean(clock.times[w:]), "cpu_s": _mean(clock.cpu[w:]), "reads_per_step": _mean(clock.reads),
            "collate_s_per_step": clock.collate_s / len(clock.times)}


def run_host_overhead(shape: str, out: Path, workdir: Path, variants: Sequence[str], method: str = "lora",
                      batch: int = 8, seq: int = 64, warmup: int = 3, steps: int = 10, repeats: int = 3,
                      vocab: int | None = None, fused_head: str = "model") -> dict:
    import torch

    for v in variants:
        if v not in VARIANTS:
            raise BenchError(f"--variants: unknown variant {v!r} (known: {', '.join(VARIANTS)})")
    if fused_head not in FUSED_HEADS:
        raise BenchError(f"--fused-head: {fused_head!r} is not one of {', '.join(FUSED_HEADS)}")
    torch.set_num_threads(1)  # the host's own work, not how many cores the toy arithmetic spreads over
    cfg = toy_shape(shape, vocab)
    workdir.mkdir(parents=True, exist_ok=True)
    model_dir = workdir / f"model-{shape}-toy-v{cfg['vocab_size']}"
    if not model_dir.exists():
        build_model_dir(cfg, model_dir)
    words = min(cfg["vocab_size"], TOY_TOKENIZER_WORDS)
    data = write_text_dataset(workdir / f"data-{seq}-v{words}.jsonl", batch * (warmup + steps) + 8, seq + 8, words)
    spec: dict[str, Any] = {"kind": "bare", "backend": "hf", "method": method, "shape": shape, "options": {},
                            "seq": seq, "batch": batch, "warmup": warmup, "steps": steps, "device": "cpu",
                            "dtype": "float32", "fused_adamw": True, "data": str(data),
                            "lr": {"full": 1e-5, "lora": 2e-4}}
    runs: dict[str, list[dict]] = {"bare": [], **{v: [] for v in variants}}
    for r in range(repeats):  # interleaved: bare, each variant, then again
        runs["bare"].append(_bare(spec, model_dir))
        for v in variants:
            runs[v].append(_finetune(spec, model_dir, data, workdir / f"run-{r}-{v}", VARIANTS[v], fused_head))
    med = {k: {m: statistics.median(x[m] for x in xs) for m in xs[0]} for k, xs in runs.items()}
    bare = med["bare"]["step_s"]
    bare_cpu = med["bare"]["cpu_s"]
    rows = [{"variant": k, "sets": VARIANTS.get(k, []), "step_ms": 1e3 * m["step_s"],
             "overhead_ms": 1e3 * (m["step_s"] - bare), "cpu_ms": 1e3 * m["cpu_s"],
             "cpu_overhead_ms": 1e3 * (m["cpu_s"] - bare_cpu), "reads_per_step": m["reads_per_step"],
             "collate_ms_per_step": 1e3 * m["collate_s_per_step"],
             "step_ms_each": [round(1e3 * x["step_s"], 2) for x in runs[k]]} for k, m in med.items()]
    import platform

    import transformers
    import trl

    res = {"shape": shape, "toy_config": cfg, "vocab": cfg["vocab_size"], "fused_head": fused_head, "method": method,
           "batch": batch, "seq": seq, "warmup": warmup,
           "steps": steps, "repeats": repeats, "rows": rows, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
           "versions": {"python": platform.python_version(), "torch": torch.__version__,
                        "transformers": transformers.__version__, "trl": trl.__version__},
           "cpu": platform.processor() or platform.machine()}
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / "host-overhead.json", res)
    atomic_write(out / "host-overhead.md", render(res))
    return res


def render(res: dict) -> str:
    head = {"model": "finetune's loss: the model's own (a CPU's)",
            "torch": "finetune's loss: TRL's fused head, torch stand-in kernel"}[res.get("fused_head", "model")]
    lines = [f"host overhead per step, {res['shape']} layers at toy width, vocab {res.get('vocab')}, {res['method']}, "
             f"batch {res['batch']} x seq {res['seq']}, CPU, median of {res['repeats']}; {head}", "",
             "| run | options | host CPU ms / step | over bare | wall ms / step | over bare | host reads / step "
             "| collation ms / step |", "|---|---|---:|---:|---:|---:|---:|---:|"]
    for r in res["rows"]:
        lines.append(f"| {r['variant']} | {' '.join(r['sets'])} | {r['cpu_ms']:.1f} | {r['cpu_overhead_ms']:+.1f} | "
                     f"{r['step_ms']:.1f} | {r['overhead_ms']:+.1f} | "
                     f"{r['reads_per_step']:.1f} | {r['collate_ms_per_step']:.1f} |")
    return "\n".join(lines) + "\n"


def main_host(args) -> int:
    import tempfile

    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    for v in variants:  # before anything is written
        if v not in VARIANTS:
            raise BenchError(f"--variants: unknown variant {v!r} (known: {', '.join(VARIANTS)})")
    for name in ("batch", "seq", "steps", "repeats"):
        if getattr(args, name) < 1:
            raise BenchError(f"--{name}: must be >= 1, got {getattr(args, name)}")
    if args.vocab is not None and args.vocab < 64:
        raise BenchError(f"--vocab: must be >= 64, got {args.vocab}")
    work = args.workdir or Path(tempfile.mkdtemp(prefix="bench-host-"))
    res = run_host_overhead(args.shape, args.out, work, variants, args.method, args.batch, args.seq,
                            args.warmup, args.steps, args.repeats, args.vocab, args.fused_head)
    print(render(res), end="")
    print(json.dumps({"bare_cpu_ms": res["rows"][0]["cpu_ms"],
                      "finetune_cpu_ms": {r["variant"]: r["cpu_ms"] for r in res["rows"][1:]}}))
    return 0
