"""Orchestration: build each shape once, run every row in its own subprocess, write results.json
after each row (a crash or OOM of one row is recorded and the rest go on)."""

from __future__ import annotations

import dataclasses
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from toolbox_train.disk import write_json
from toolbox_train.bench.environment import device_info, versions
from toolbox_train.bench.report import fmt_num, targets
from toolbox_train.bench.shapes import SHAPES, mfu, peak_flops
from toolbox_train.bench.suites import Row
from toolbox_train.bench.synthetic import build_model_dir, write_text_dataset


def run_matrix(rows: list[Row], out: Path, *, device: str = "cuda", seq: int = 2048, batch: int = 8,
               warmup: int = 3, steps: int = 10, peak_tflops: float | None = None,
               row_timeout: float = 600, workdir: Path | None = None, command: str = "") -> dict:
    out.mkdir(parents=True, exist_ok=True)
    dinfo = device_info(device)
    peak = peak_tflops * 1e12 if peak_tflops else peak_flops(dinfo.get("name"))
    work = Path(workdir or tempfile.mkdtemp(prefix="toolbox-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    results: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "command": command,
        "device": dinfo, "peak_bf16_flops": peak, "seq": seq, "batch": batch, "warmup": warmup,
        "steps": steps, "versions": versions(), "rows": [],
    }
    built: dict[str, tuple[str, str, int]] = {}
    for row in rows:
        rec: dict[str, Any] = {"id": row.id, **dataclasses.asdict(row)}
        reason = row.needs_gpu() if not device.startswith("cuda") else None
        if reason:
            rec.update(status="skipped", error=reason)
            results["rows"].append(rec)
            continue
        if row.shape not in built:
            mdir = work / f"model-{row.shape}"
            t0 = time.time()
            build_model_dir(row.shape, mdir, device if device.startswith("cuda") else "cpu")
            vocab = min(SHAPES[row.shape]["vocab_size"], 32768)
            n_rows = 2 * max(batch, 16) * (warmup + steps) + 64
            data = write_text_dataset(work / f"data-{row.shape}.jsonl", n_rows, seq + 16, vocab)
            built[row.shape] = (str(mdir), str(data), vocab)
            print(f"bench: built {row.shape} in {time.time() - t0:.1f}s", flush=True)
        mdir, data, vocab = built[row.shape]
        spec = {**dataclasses.asdict(row), "device": device, "seq": seq, "batch": batch, "warmup": warmup,
                "steps": steps, "model_dir": mdir, "data": data, "tok_vocab": vocab, "workdir": str(work),
                "lr": {"full": 1e-5, "lora": 2e-4}}
        spec_path, res_path = work / "spec.json", work / "result.json"
        write_json(spec_path, spec)
        res_path.unlink(missing_ok=True)
        print(f"bench: --- {row.id}", flush=True)
        t0 = time.time()
        try:
            p = subprocess.run([sys.executable, "-m", "toolbox_train.bench", "_row", str(spec_path), str(res_path)],
                               timeout=row_timeout)
            rc = p.returncode
        except subprocess.TimeoutExpired:
            rc = "timeout"
        if rc == 0 and res_path.exists():
            rec.update(json.loads(res_path.read_text()))
            if rec.get("tokens_per_s"):
                m = mfu(rec["tokens_per_s"], row.shape, seq, row.method, peak)
                rec["mfu"] = m
        else:
            rec.update(status="failed", error=f"exit {rc} after {time.time() - t0:.0f}s (see log)")
        print(f"bench: {row.id}: {_brief(rec)}", flush=True)
        results["rows"].append(rec)
        results["targets"] = targets(results)
        write_json(out / "results.json", results)
    results["targets"] = targets(results)
    write_json(out / "results.json", results)
    shutil.rmtree(work, ignore_errors=True) if workdir is None else None
    return results


def _brief(rec: dict) -> str:
    if rec.get("status") != "ok":
        return f"{rec.get('status')}: {rec.get('error')}"
    if rec["kind"] == "memscale":
        return f"max seq {rec['max_seq']}"
    return (f"{rec['tokens_per_s']:,.0f} tok/s, peak {fmt_num(rec.get('peak_gib'), '.1f')} GiB, "
            f"loss {rec['loss_first']:.3f} -> {rec['loss_last']:.3f}")
