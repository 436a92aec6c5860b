"""Decisions from the memory planner: `gradient_checkpointing: auto`, what fits, the `--plan` table.

arithmetic.py is the arithmetic; this module chooses with it (finetune/launch `--plan`,
`python -m toolbox_train.planning.memory` for a table from a config.json or a known public shape).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path

from toolbox_train.models.arithmetic import GiB, Estimate, Setting, Shape, estimate, parse_size
from toolbox_train.units import registry
from toolbox_train.units.objective import Context

SAFETY = 0.85  # plan to use at most 85% of the device: the planner is calibrated to about +-15%


def candidates(s: Shape, st: Setting) -> list[Setting]:
    """The configured setting and its checkpointing alternatives (the fastest first)."""
    gcs = [False, "unsloth"] if st.backend == "unsloth" else [False, True]
    return [dataclasses.replace(st, gradient_checkpointing=g) for g in gcs]


@dataclass
class Decision:
    gradient_checkpointing: bool | str
    reason: str
    estimates: list[Estimate] = field(default_factory=list)
    fits: bool = True


def decide_checkpointing(s: Shape, st: Setting, device_bytes: float | None) -> Decision:
    """`train.gradient_checkpointing: auto`: off where the plan fits with the safety margin.

    Unsloth keeps its offloaded checkpointing (what its bare loop runs; off is not measured to
    be faster on the shapes benchmarked, and it costs memory).
    """
    ests = [estimate(s, c) for c in candidates(s, st)]
    off, on = ests
    if st.backend == "unsloth":
        return Decision("unsloth", "backend unsloth: its offloaded checkpointing (as its own loop runs it)",
                        ests, device_bytes is None or on.peak <= device_bytes)
    if device_bytes is None:
        return Decision(True, "no device memory known (CPU, no --device-memory): checkpointing on", ests)
    budget = SAFETY * device_bytes
    if off.peak <= budget:
        return Decision(False, f"predicted {off.peak_gib:.1f} GiB without checkpointing fits "
                               f"{SAFETY:.0%} of {device_bytes / GiB:.0f} GiB: off (faster)", ests)
    fits = on.peak <= device_bytes
    return Decision(True, f"without checkpointing {off.peak_gib:.1f} GiB > {SAFETY:.0%} of "
                          f"{device_bytes / GiB:.0f} GiB: on ({on.peak_gib:.1f} GiB)", ests, fits)


# `per_device_batch_size: auto`. tokens/s stops growing past ~16k-32k tokens a micro-batch: bare HF + Liger,
# llama-1b on an H200, batch 8 x 2048: 65,508; 16: 70,417; 32: ~70,400 (docs/benchmarks.md); the larger
# batch only costs memory. Checkpointing recomputes the forward: finetune hf full 50,298 with it vs 61,463
# without at the same batch (0.82x), so a batch with it counts 0.8 of one without.
AUTO_MAX_TOKENS = 32768
CKPT_SPEED = 0.8


def decide_batch(s: Shape, st: Setting, device_bytes: float | None, divides: int | None = None) -> tuple[int, bool | str, str]:
    """The fastest (batch, checkpointing) that fits SAFETY of the device: powers of two up to
    AUTO_MAX_TOKENS a micro-batch (dividing `divides`, the global batch per device, when set)."""
    if device_bytes is None:
        return 1, st.gradient_checkpointing if st.gradient_checkpointing != "auto" else True, \
            "no device memory known: 1"
    sizes = [b for b in (2 ** i for i in range(12)) if b == 1 or b * st.seq <= AUTO_MAX_TOKENS]
    if divides:
        sizes = [b for b in sizes if divides % b == 0]
    gc = st.gradient_checkpointing
    gcs = [gc] if gc != "auto" else ["unsloth"] if st.backend == "unsloth" else [False, True]
    best = None
    for g in gcs:
        fit = [b for b in sizes if estimate(s, dataclasses.replace(st, batch=b, gradient_checkpointing=g)).peak
               <= SAFETY * device_bytes]
        if fit:
            score = min(fit[-1] * st.seq, AUTO_MAX_TOKENS) * (CKPT_SPEED if len(gcs) > 1 and g is True else 1)
            if best is None or score > best[0]:
                best = (score, fit[-1], g)
    if best is None:
        return 1, gcs[-1], f"nothing fits {SAFETY:.0%} of {device_bytes / GiB:.0f} GiB, even at 1"
    _, b, g = best
    return b, g, (f"the largest that fits {SAFETY:.0%} of {device_bytes / GiB:.0f} GiB "
                  f"{'without checkpointing' if g is False else 'with checkpointing ' + str(g)}, "
                  f"at most {AUTO_MAX_TOKENS:,} tokens a micro-batch")


def alternatives(s: Shape, st: Setting, device_bytes: float) -> list[Estimate]:
    """What would fit instead, cheapest change first: checkpointing, smaller batch, QLoRA, shorter sequence."""
    out = []
    trials = [dataclasses.replace(st, gradient_checkpointing="unsloth" if st.backend == "unsloth" else True)]
    b = st.batch
    while b > 1:
        b //= 2
        trials.append(dataclasses.replace(trials[0], batch=b))
    if st.method == "full":  # 8-bit optimizer states, or the states sharded over two devices (FSDP)
        trials.append(dataclasses.replace(trials[0], batch=1, optimizer="paged_adamw_8bit"))
        trials.append(dataclasses.replace(trials[0], batch=1, strategy="fsdp", world_size=2 * max(1, st.world_size)))
    for m in ("lora", "qlora"):
        if m != st.method:
            trials.append(dataclasses.replace(trials[0], method=m, batch=1))
    seq = st.seq
    while seq > 256:
        seq //= 2
        trials.append(dataclasses.replace(trials[0], batch=1, seq=seq))
    for t in trials:
        e = estimate(s, t)
        if e.peak <= device_bytes:
            out.append(e)
    return out[:3]


def longest_seq(s: Shape, st: Setting, device_bytes: float, cap: int | None = None) -> int:
    """Longest sequence (multiple of 1024) at the setting's batch whose plan fits, 0 if none."""
    cap = cap or s.max_position or 131072
    lo, hi = 0, cap // 1024
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if estimate(s, dataclasses.replace(st, seq=mid * 1024)).peak <= device_bytes:
            lo = mid
        else:
            hi = mid - 1
    return lo * 1024


def render_table(s: Shape, ests: list[Estimate], device_bytes: float | None, picked: Setting | None) -> str:
    dev = f"{device_bytes / GiB:.1f} GiB" if device_bytes else "unknown"
    lines = [f"plan for {s.name or s.model_type}: {s.n_params() / 1e9:.2f}B parameters, device memory {dev}",
             "| setting | weights | opt. states | activations | peak GiB | host GiB | fits | picked |",
             "|---|---:|---:|---:|---:|---:|---|---|"]
    for e in ests:
        fits = "-" if not device_bytes else "yes" if e.peak <= SAFETY * device_bytes else \
            "tight" if e.peak <= device_bytes else "NO"
        pick = "<-" if picked is not None and e.setting == picked else ""
        lines.append(f"| {e.setting.label()} | {e.parts['weights'] / GiB:.1f} | "
                     f"{e.parts['optimizer_states'] / GiB:.1f} | {e.parts['activations_peak'] / GiB:.1f} | "
                     f"{e.peak_gib:.1f} | {e.host / GiB:.1f} | {fits} | {pick} |")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------- finetune


@dataclass(frozen=True)
class Machine:
    """The GPU machine a run will use, when planned from another (`finetune --plan --machine/--device-memory`)."""

    name: str
    memory_gib: float
    unified: bool = False  # host memory is device memory (Unsloth's offloaded activations count)
    liger: bool = True  # liger-kernel installed there (`liger: auto` turns it on for backend hf)

    def describe(self) -> str:
        return f"{self.name} ({self.memory_gib:g} GiB{', unified memory' if self.unified else ''})"


# Named machines. The gfx1151 image has no liger-kernel (toolbox/stacks/gfx1151.yaml), so `liger: auto`
# is off there; the H200 figures in docs/benchmarks.md ran with it.
MACHINES = {
    "strix-halo": Machine("strix-halo", 128, unified=True, liger=False),
    "h200": Machine("h200", 139),
}


def machine_for(name: str | None, device_memory: str | None) -> Machine | None:
    """`--machine NAME` and/or `--device-memory SIZE` (which overrides the named machine's memory)."""
    if name is None and device_memory is None:
        return None
    base = MACHINES[name] if name else Machine("a GPU machine", 0)
    if device_memory:
        base = dataclasses.replace(base, memory_gib=round(parse_size(device_memory) / GiB, 2))
    return base



@dataclass(frozen=True)
class MemoryPlan:
    shape: Shape
    setting: Setting  # what will run (checkpointing resolved)
    decision: Decision
    device_bytes: float | None
    table: str
    batch_reason: str = ""  # per_device_batch_size: auto
    note: str = ""  # the objective's own part (its memory hook's note: a sampler, a teacher)
    line: str = ""  # the banner line (made with the plan: summarized)
    resolved: dict = field(default_factory=dict)  # what config.resolved.yaml's `_resolved` says of it

    def estimate(self) -> Estimate:
        return estimate(self.shape, self.setting)

    def banner(self) -> str:
        return self.line

    def summarized(self) -> "MemoryPlan":
        """The plan with its banner line and config.resolved.yaml's part, from one estimate."""
        e = self.estimate()
        ref = e.parts.get("reference_model")
        line = (f"memory plan: predicted peak {e.peak_gib:.1f} GiB per device"
                + (f" of {self.device_bytes / GiB:.1f} GiB" if self.device_bytes else "")
                + (f" (with the frozen reference copy, {ref / GiB:.2f} GiB)" if ref else "")
                + f"; gradient checkpointing {self.decision.gradient_checkpointing} ({self.decision.reason})"
                + (f"; {self.note}" if self.note else "")
                + (f", its KV cache {e.parts['sampler_kv_cache'] / GiB:.2f} GiB"
                   f"{' (static: held through the step)' if self.setting.sampler_kv_resident else ''}"
                   if e.parts.get("sampler_kv_cache") else ""))
        return dataclasses.replace(self, line=line, resolved={
            "gradient_checkpointing_reason": self.decision.reason, "predicted_peak_gib": round(e.peak_gib, 2),
            "device_memory_gib": round(self.device_bytes / GiB, 2) if self.device_bytes else None})


def device_memory(override: str | None = None, local_rank: int = 0) -> float | None:
    """`--device-memory`, else the free memory of this rank's GPU, else None (CPU)."""
    if override:
        return float(parse_size(override))
    try:
        import torch

        if torch.cuda.is_available():
            return float(torch.cuda.mem_get_info(local_rank)[0])
    except Exception:  # no driver, no device: plan without a device
        return None
    return None


def unified_memory(local_rank: int = 0) -> bool:
    """An integrated GPU (Strix Halo's gfx1151): host memory is device memory, so Unsloth's offloaded
    activations count against the same budget."""
    try:
        import torch

        return bool(torch.cuda.is_available() and getattr(torch.cuda.get_device_properties(local_rank),
                                                          "is_integrated", False))
    except Exception:  # no driver, no device
        return False


def plan_training(cfg, model_config, backend: str, liger: bool, world_size: int = 1, fsdp: bool = False,
                  precision: str = "bf16", device_bytes: float | None = None, gpu: bool = True,
                  unified: bool = False, lora_params: int | None = None, unit=None, reference: str | None = None,
                  seq: int | None = None, patches_per_image: int = 0, extras: dict | None = None, image_rows=False):
    """The planner's view of a finetune config; resolves `gradient_checkpointing: auto`. `lora_params`: the
    adapter's size where PEFT built it (planning/run.py), in place of the arithmetic's count; `unit` and
    `reference`, `seq`: the run's objective, reference model and tokens a sequence (planning/run.py), else read
    from `cfg`, `extras` the unit's (else asked here). `patches_per_image`: a row's patches in the tower."""
    mc = model_config.to_dict() if hasattr(model_config, "to_dict") else dict(model_config)
    shape = Shape.from_config(mc, name=str(getattr(cfg.model, "path", "")))
    t = cfg.train
    unit = unit or registry.of(cfg)
    reference = reference or unit.reference(cfg)
    # the sequences of one example in a forward (DPO/ORPO: chosen and rejected in one batch)
    rows = unit.rows
    # the tokens the loss reads a sequence: GRPO's each prompt with its completion (max_seq_length bounds the prompt)
    seq = seq or cfg.data.max_seq_length + unit.extra_tokens(cfg)
    # chunked: TRL's fused head; the model's logits: ORPO, SFT's image batches (faster, docs/benchmarks.md); not Unsloth
    head = "full" if not gpu or image_rows and backend != "unsloth" else "logits" if unit.logits and backend != "unsloth" \
        else "chunked"
    st = Setting(method=cfg.method, backend=backend, liger=liger, gradient_checkpointing=t.gradient_checkpointing,
                 batch=t.per_device_batch_size * rows, seq=seq,
                 reference_copy=reference == "copy", precision=precision,
                 optimizer=t.optimizer, lora_r=cfg.lora.r, lora_targets=cfg.lora.target_modules,
                 world_size=world_size, strategy="fsdp" if fsdp else "ddp" if world_size > 1 else "single",
                 head=head, unified_memory=unified, lora_params=lora_params, patches_per_row=patches_per_image,
                 vision_train=tuple(getattr(getattr(cfg, "vision", None), "train", ())) if shape.tower else ())
    batch_reason = ""
    if t.per_device_batch_size == "auto":
        per_dev = t.batch_size // world_size if t.batch_size else None
        b, _, batch_reason = decide_batch(shape, dataclasses.replace(st, batch=1), device_bytes, per_dev)
        st = dataclasses.replace(st, batch=b)
    ctx, note = Context(cfg, Path("."), backend, gpu, world_size, fsdp), ""
    if unit.memory:  # a sampler's KV cache, a teacher's weights (its extras: the run's, else asked here)
        st, note = unit.memory(ctx, unit.resolve(ctx) if extras is None else extras, st, shape)
    dec = decide_checkpointing(shape, st, device_bytes)
    if t.gradient_checkpointing != "auto":
        chosen = t.gradient_checkpointing
        e = estimate(shape, dataclasses.replace(st, gradient_checkpointing=chosen))
        fits = device_bytes is None or e.peak <= device_bytes
        dec = Decision(chosen, "set in the config", dec.estimates, fits)
    final = dataclasses.replace(st, gradient_checkpointing=dec.gradient_checkpointing)
    rows = dec.estimates + ([estimate(shape, final)] if final not in [e.setting for e in dec.estimates] else [])
    if device_bytes and estimate(shape, final).peak > device_bytes:  # what would fit instead
        rows += [a for a in alternatives(shape, final, device_bytes) if a.setting not in [r.setting for r in rows]]
    return MemoryPlan(shape, final, dec, device_bytes, render_table(shape, rows, device_bytes, final), batch_reason,
                      note).summarized()


def refusal(p: MemoryPlan) -> str | None:
    """One line saying why the plan cannot fit and what would, or None if it fits."""
    if p.device_bytes is None:
        return None
    e = estimate(p.shape, p.setting)
    if e.peak <= p.device_bytes:
        return None
    alts = alternatives(p.shape, p.setting, p.device_bytes)
    instead = "; ".join(f"{a.setting.label()} ({a.peak_gib:.1f} GiB)" for a in alts) or "nothing the planner knows"
    return (f"predicted peak {e.peak_gib:.1f} GiB per device for {p.setting.label()} does not fit "
            f"{p.device_bytes / GiB:.1f} GiB; would fit: {instead}")


# ---------------------------------------------------------------------------------- public shapes

_SIGLIP = dict(hidden_size=1152, intermediate_size=4304, num_hidden_layers=27, patch_size=14, image_size=896)


def _gemma3(h, i, L, nh, nkv, hd):
    return {"model_type": "gemma3", "tie_word_embeddings": True, "vision_config": _SIGLIP,
            "text_config": dict(model_type="gemma3_text", hidden_size=h, intermediate_size=i, num_hidden_layers=L,
                                num_attention_heads=nh, num_key_value_heads=nkv, head_dim=hd, vocab_size=262208,
                                sliding_window=1024, max_position_embeddings=131072)}


def _dense(mt, h, i, L, nh, nkv, vocab, max_pos, hd=128, tied=False):
    return dict(model_type=mt, hidden_size=h, intermediate_size=i, num_hidden_layers=L, num_attention_heads=nh,
                num_key_value_heads=nkv, head_dim=hd, vocab_size=vocab, tie_word_embeddings=tied,
                max_position_embeddings=max_pos)


# The numbers of the public config.json files that memory depends on (no weights downloaded).
PUBLIC_SHAPES = {
    "gemma-3-4b": _gemma3(2560, 10240, 34, 8, 4, 256),
    "gemma-3-12b": _gemma3(3840, 15360, 48, 16, 8, 256),
    "gemma-3-27b": _gemma3(5376, 21504, 62, 32, 16, 128),
    "qwen3-8b": _dense("qwen3", 4096, 12288, 36, 32, 8, 151936, 40960),
    "qwen3-14b": _dense("qwen3", 5120, 17408, 40, 40, 8, 151936, 40960),
    "qwen3-32b": _dense("qwen3", 5120, 25600, 64, 64, 8, 151936, 40960),
    "llama-3.1-8b": _dense("llama", 4096, 14336, 32, 32, 8, 128256, 131072),
    "gpt-oss-20b": {**_dense("gpt_oss", 2880, 2880, 24, 64, 8, 201088, 131072, hd=64), "num_local_experts": 32,
                    "num_experts_per_tok": 4, "attention_bias": True, "sliding_window": 128},
}


def strix_rows(device_bytes: float = 128 * GiB, models=tuple(PUBLIC_SHAPES)) -> list[dict]:
    """Per model, method and backend: the longest sequence at batch 1 that the plan fits (unified memory:
    Unsloth's offloaded activations count too)."""
    rows = []
    for name in models:
        shape = Shape.from_config(PUBLIC_SHAPES[name], name)
        for backend in ("hf", "unsloth"):
            for method in ("full", "lora", "qlora", "lora-8bit"):
                if backend == "unsloth" and method == "lora-8bit":
                    continue  # not calibrated on Unsloth
                st = Setting(method=method, backend=backend, liger=backend == "hf", batch=1, seq=1024,
                             gradient_checkpointing="unsloth" if backend == "unsloth" else True,
                             unified_memory=True)
                n = longest_seq(shape, st, device_bytes)
                at = estimate(shape, dataclasses.replace(st, seq=max(n, 1024)))
                at512 = estimate(shape, dataclasses.replace(st, seq=512))
                rows.append({"model": name, "params_b": shape.n_params() / 1e9, "backend": backend, "method": method,
                             "longest_seq": n, "peak_gib_at_longest": at.peak_gib if n else None,
                             "peak_gib_at_512": at512.peak_gib})
    return rows


def render_strix(rows: list[dict]) -> str:
    lines = ["| model | params | backend | method | longest seq, batch 1 | GiB there | GiB at seq 512 |",
             "|---|---:|---|---|---:|---:|---:|"]
    for r in rows:
        seq = f"{r['longest_seq']:,}" if r["longest_seq"] else "does not fit"
        there = f"{r['peak_gib_at_longest']:.0f}" if r["peak_gib_at_longest"] else "-"
        lines.append(f"| {r['model']} | {r['params_b']:.1f}B | {r['backend']} | {r['method']} | {seq} | {there} | "
                     f"{r['peak_gib_at_512']:.0f} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    import argparse
    import json
    import sys
    from pathlib import Path

    ap = argparse.ArgumentParser(prog="python -m toolbox_train.planning.memory", description=__doc__.splitlines()[0])
    ap.add_argument("--strix", action="store_true", help="the table for the known public shapes")
    ap.add_argument("--device-memory", default="128GiB")
    ap.add_argument("--model", help=f"a config.json, or one of: {', '.join(PUBLIC_SHAPES)}")
    a = ap.parse_args(argv)
    try:
        dev = parse_size(a.device_memory)
    except ValueError as exc:
        print(f"planner: error: --device-memory {exc}", file=sys.stderr)
        return 2
    if a.model:
        if a.model in PUBLIC_SHAPES:
            cfg = PUBLIC_SHAPES[a.model]
        else:
            try:
                cfg = json.loads(Path(a.model).read_text())
            except (OSError, ValueError) as exc:
                print(f"planner: error: --model {a.model}: {exc}", file=sys.stderr)
                return 2
        PUBLIC_SHAPES.setdefault(a.model, cfg)
        print(render_strix(strix_rows(dev, (a.model,))))
        return 0
    print(render_strix(strix_rows(dev)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
