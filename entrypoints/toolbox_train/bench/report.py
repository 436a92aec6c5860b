"""Targets as measured ratios, the markdown table, the chart, and merging results files."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Sequence

from toolbox_train.disk import atomic_write, write_json
from toolbox_train.bench.shapes import BenchError


# Targets (issue 7) as measured ratios


def _find(rows: list[dict], shape: str, kind: str, backend: str, method: str, **opts) -> dict | None:
    """The ok row of exactly these options (none given: the plain row)."""
    for r in rows:
        if (r["shape"], r["kind"], r["backend"], r["method"]) == (shape, kind, backend, method) \
                and r.get("status") == "ok" and r["options"] == opts:
            return r
    return None


def targets(results: dict) -> list[dict]:
    rows = results["rows"]
    out = []
    for shape in dict.fromkeys(r["shape"] for r in rows):
        ft_u = _find(rows, shape, "finetune", "unsloth", "lora")
        ft_h = _find(rows, shape, "finetune", "hf", "lora")
        bare_u = _find(rows, shape, "bare", "unsloth", "lora")
        trl_h = _find(rows, shape, "trl", "hf", "lora", ckpt=True)
        bare_full = _find(rows, shape, "bare", "hf", "full")
        # the toolbox's own defaults: finetune full rows with no option set
        fulls = [r for r in rows if r["shape"] == shape and r["kind"] == "finetune" and r["method"] == "full"
                 and r.get("status") == "ok" and not r["options"]]
        best_full = max(fulls, key=lambda r: r["tokens_per_s"]) if fulls else None

        def add(name, a, b, key, goal, cmp):
            if a and b and a.get(key) and b.get(key):
                ratio = a[key] / b[key]
                out.append({"shape": shape, "target": name, "measured": ratio, "goal": goal,
                            "met": ratio >= goal if cmp == ">=" else ratio <= goal, "cmp": cmp,
                            "rows": [a["id"], b["id"]]})

        add("finetune unsloth lora / bare Unsloth lora, tokens/s", ft_u, bare_u, "tokens_per_s", 0.95, ">=")
        add("finetune unsloth lora / bare Unsloth lora, peak memory", ft_u, bare_u, "peak_gib", 1.1, "<=")
        add("finetune unsloth lora / TRL+PEFT, tokens/s", ft_u, trl_h, "tokens_per_s", 1.6, ">=")
        add("finetune hf lora / TRL+PEFT, tokens/s", ft_h, trl_h, "tokens_per_s", 0.95, ">=")
        add("best finetune full / plain HF full, peak memory", best_full, bare_full, "peak_gib", 0.5, "<=")
        if best_full and results.get("device", {}).get("name", "").find("H200") >= 0 and shape == "llama-1b":
            out.append({"shape": shape, "target": "best finetune full, tokens/s (H200)",
                        "measured": best_full["tokens_per_s"], "goal": 75000, "cmp": ">=",
                        "met": best_full["tokens_per_s"] >= 75000, "rows": [best_full["id"]]})
    return out


def fmt_num(x, spec: str = ",.0f") -> str:
    return "-" if x is None else format(x, spec)


def _opts(r: dict) -> str:
    return ", ".join(k if v is True else f"no {k}" if v is False else f"{k}={v}"
                     for k, v in sorted(r["options"].items()) if v is not None)


def render_table(results: dict) -> str:
    lines = []
    d = results.get("device", {})
    lines.append(f"Device: {d.get('name')} | seq {results['seq']}, batch {results['batch']}, "
                 f"{results['warmup']} warm-up + {results['steps']} timed steps | {results.get('date')}")
    lines.append("")
    lines.append("| shape | row | backend | method | options | tokens/s | peak GiB | MFU | loss first → last | status |")
    lines.append("|---|---|---|---|---|---:|---:|---:|---|---|")
    for r in results["rows"]:
        if r["kind"] == "memscale":
            continue
        ok = r.get("status") == "ok"
        loss = f"{r['loss_first']:.3f} → {r['loss_last']:.3f}" if ok and r.get("loss_first") is not None else "-"
        status = "ok" if ok else f"{r.get('status')}: {r.get('error', '')}".replace("|", "/")
        lines.append(f"| {r['shape']} | {r.get('label') or r['kind']} | {r['backend']} | {r['method']} | {_opts(r)} "
                     f"| {fmt_num(r.get('tokens_per_s')) if ok else '-'} | {fmt_num(r.get('peak_gib'), '.1f') if ok else '-'} "
                     f"| {fmt_num(r.get('mfu') * 100, '.1f') + '%' if ok and r.get('mfu') else '-'} | {loss} | {status} |")
    if results.get("targets"):
        lines += ["", "| shape | target | measured | goal | met |", "|---|---|---:|---:|---|"]
        for t in results["targets"]:
            m = fmt_num(t["measured"], ",.0f") if t["goal"] > 100 else f"{t['measured']:.2f}x"
            g = fmt_num(t["goal"], ",.0f") if t["goal"] > 100 else f"{t['cmp']} {t['goal']}x"
            lines.append(f"| {t['shape']} | {t['target']} | {m} | {g} | {'yes' if t['met'] else 'NO'} |")
    mem = [r for r in results["rows"] if r["kind"] == "memscale"]
    if mem:
        lines += ["", "Memory scaling: LoRA r16, batch 1, one training step per length (✗ = out of memory)", "",
                  "| shape | backend | longest seq that fits | probes (seq: peak GiB) |", "|---|---|---:|---|"]
        for r in mem:
            if r.get("status") != "ok":
                lines.append(f"| {r['shape']} | {r['backend']} | - | {r.get('status')}: {r.get('error')} |")
                continue
            probes = ", ".join(f"{p['seq']}: {p['peak_gib']:.1f}" if p["fits"] and p.get("peak_gib") is not None
                               else f"{p['seq']}: {'ok' if p['fits'] else '✗'}" for p in r["probes"])
            best = f"{r['max_seq']:,}" + (" (all probed lengths fit)" if r.get("max_seq_bounded") else "")
            lines.append(f"| {r['shape']} | {r['backend']} | {best} | {probes} |")
    return "\n".join(lines) + "\n"


def render_chart(results: dict, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ok = [r for r in results["rows"] if r.get("status") == "ok" and r["kind"] != "memscale"]
    shapes = list(dict.fromkeys(r["shape"] for r in ok)) or ["(no rows)"]
    heights = [max(1, sum(r["shape"] == s for r in ok)) for s in shapes]
    fig, axes = plt.subplots(len(shapes), 2, figsize=(13, 1.2 + 0.38 * sum(heights) + 0.6 * len(shapes)),
                             squeeze=False, gridspec_kw={"height_ratios": heights})
    colors = {"bare": "#9e9e9e", "trl": "#e08a3c", "finetune": "#2f6fb0", "launch": "#6a4fb0"}
    for (ax_t, ax_m), shape in zip(axes, shapes):
        rs = [r for r in ok if r["shape"] == shape][::-1]
        labels = [f"{r.get('label') or r['id']}" for r in rs]
        c = [colors.get(r["kind"], "#555") for r in rs]
        y = range(len(rs))
        ax_t.barh(y, [r["tokens_per_s"] for r in rs], color=c)
        ax_t.set_yticks(list(y), labels, fontsize=8)
        ax_t.set_title(f"{shape}: tokens/s (higher is better)", fontsize=9)
        ax_m.barh(y, [r.get("peak_gib") or 0 for r in rs], color=c)
        ax_m.set_yticks(list(y), [""] * len(rs))
        ax_m.set_title(f"{shape}: peak allocated GiB (lower is better)", fontsize=9)
        for ax, key, f in ((ax_t, "tokens_per_s", "{:,.0f}"), (ax_m, "peak_gib", "{:.1f}")):
            for yi, r in zip(y, rs):
                if r.get(key) is not None:
                    ax.text(r[key], yi, " " + f.format(r[key]), va="center", fontsize=7)
            ax.margins(x=0.18)
            ax.tick_params(axis="x", labelsize=7)
    d = results.get("device", {})
    fig.suptitle(f"finetune vs references on {d.get('name')}, seq {results['seq']}, batch {results['batch']}, bf16 "
                 "(grey: bare loops, orange: TRL direct, blue: finetune, purple: launch)", fontsize=9)
    fig.tight_layout()
    png = io.BytesIO()
    fig.savefig(png, format="png", dpi=110)
    plt.close(fig)
    atomic_write(path, png.getvalue())
    return path


def merge(paths: Sequence[Path]) -> dict:
    """Combine results.json files (e.g. shapes run in separate device calls)."""
    merged: dict | None = None
    for p in paths:
        try:
            r = json.loads(Path(p).read_text())
        except (OSError, json.JSONDecodeError) as e:
            raise BenchError(f"{p}: cannot read results ({e})") from e
        if not isinstance(r, dict) or "rows" not in r:
            raise BenchError(f"{p}: not a bench results.json (no 'rows')")
        if merged is None:
            merged = r
            continue
        seen = {x["id"]: i for i, x in enumerate(merged["rows"])}
        for x in r["rows"]:  # a later file's row replaces an earlier one of the same id
            if x["id"] in seen:
                merged["rows"][seen[x["id"]]] = x
            else:
                merged["rows"].append(x)
        merged.setdefault("merged_dates", [merged.get("date")]).append(r.get("date"))
    if merged is None:
        raise BenchError("no results.json given")
    merged["targets"] = targets(merged)
    return merged


def write_report(results: dict, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / "results.json", results)
    atomic_write(out / "results.md", render_table(results))
    render_chart(results, out / "chart.png")
