"""Issue 26's device calls: bench rows in a given order, groups repeated interleaved, one process per
row (bench's own run_matrix), then the medians and ratios of each finetune row to its reference.

    [WARMUP=3 STEPS=10 SEQ=2048 BATCH=8 DEVICE=cuda] python docs/bench/issue26_rows.py OUT TIMEOUT_S GROUP [GROUP ...]
    python docs/bench/issue26_rows.py --summary OUT GROUP [GROUP ...]

GROUP: `N*ROW,ROW,...` runs the listed rows N times in turn (ROW,ROW,ROW,ROW,...); a ROW is bench's
row id, `shape/kind-backend-method[+opt][+no-opt][+opt=value]`. The pairs read as: each finetune row
against the last bare (or trl) row listed before it in its group. `--summary` writes the medians and
ratios from OUT/results.json alone (a run cut by a time limit: the rows it finished).
"""

from __future__ import annotations

import json
import os
import re
import statistics
import sys
from pathlib import Path

from toolbox_train.bench.orchestrate import run_matrix
from toolbox_train.bench.suites import Row


def parse_row(text: str) -> Row:
    m = re.fullmatch(r"([\w.-]+)/(bare|finetune|trl)-(hf|unsloth)-(full|lora|qlora)((?:\+[\w.=-]+)*)", text)
    if not m:
        print(f"issue26_rows: bad row id {text!r}: expected shape/(bare|finetune|trl)-(hf|unsloth)-(full|lora|qlora)[+opt]",
              file=sys.stderr)
        raise SystemExit(2)
    shape, kind, backend, method, rest = m.groups()
    opts: dict = {}
    for o in filter(None, rest.split("+")):
        k, eq, v = o.partition("=")
        if eq:
            opts[k] = int(v) if v.isdigit() else v  # batch=auto stays a string
        elif k.startswith("no-"):
            opts[k[3:]] = False
        else:
            opts[k] = True
    return Row(kind, backend, method, shape, opts, label=text)


def plan_rows(groups: list[str]) -> tuple[list[Row], list[tuple[str, str]]]:
    rows, pairs = [], []
    for g in groups:
        n, _, ids = g.rpartition("*")
        members = [parse_row(x) for x in ids.split(",")]
        ref = None
        for r in members:
            if r.kind != "finetune":
                ref = r
            elif ref is not None:
                pairs.append((ref.id, r.id))
        rows += members * int(n or 1)
    return rows, pairs


def main(argv: list[str]) -> int:
    if argv and argv[0] == "--summary":
        out = Path(argv[1])
        _, pairs = plan_rows(argv[2:])
        return summarize(json.loads((out / "results.json").read_text()), pairs, out)
    out, timeout, groups = Path(argv[0]), float(argv[1]), argv[2:]
    rows, pairs = plan_rows(groups)
    res = run_matrix(rows, out, row_timeout=timeout, workdir=Path(os.environ.get("WORKDIR", "/tmp/bench-work")),
                     warmup=int(os.environ.get("WARMUP", 3)), steps=int(os.environ.get("STEPS", 10)),
                     seq=int(os.environ.get("SEQ", 2048)), batch=int(os.environ.get("BATCH", 8)),
                     device=os.environ.get("DEVICE", "cuda"),
                     command="docs/bench/issue26_rows.py " + " ".join(argv))
    return summarize(res, pairs, out)


def summarize(res: dict, pairs: list[tuple[str, str]], out: Path) -> int:
    by: dict[str, list[dict]] = {}
    for r in res["rows"]:
        by.setdefault(r["id"], []).append(r)
    summary = {}
    for rid, rs in by.items():
        ok = [r for r in rs if r.get("status") == "ok"]
        summary[rid] = {"tokens_per_s": [round(r["tokens_per_s"]) for r in ok],
                        "median": statistics.median(r["tokens_per_s"] for r in ok) if ok else None,
                        "peak_gib": max((r.get("peak_gib") or 0) for r in ok) if ok else None,
                        "failed": [r.get("error") for r in rs if r.get("status") != "ok"]}
    ratios = []
    for ref, ft in pairs:
        a, b = summary.get(ref, {}), summary.get(ft, {})
        if a.get("median") and b.get("median"):
            ratios.append({"finetune": ft, "reference": ref, "ratio": round(b["median"] / a["median"], 3),
                           "memory_ratio": round(b["peak_gib"] / a["peak_gib"], 3) if a["peak_gib"] else None})
    (out / "summary.json").write_text(json.dumps({"rows": summary, "ratios": ratios, "versions": res["versions"],
                                                  "device": res["device"], "date": res["date"]}, indent=2) + "\n")
    for rid, s in summary.items():
        med = f"{round(s['median']):,}" if s["median"] else None  # None: no row of this id finished
        print(f"{rid}: median {med} tok/s {s['tokens_per_s']} peak "
              f"{s['peak_gib'] and round(s['peak_gib'], 2)} GiB {s['failed'] or ''}")
    for r in ratios:
        print(f"RATIO {r['finetune']} / {r['reference']}: {r['ratio']}x tokens/s, {r['memory_ratio']}x memory")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
