"""`rccl-check` for real: 2 gloo processes on the CPU, collectives checked element by element.

The GPU side (NCCL/RCCL) cannot run here; the same code path runs it with --dist-backend nccl.
rccl-tests' all_reduce_perf cannot exist here either, so its output parser is exercised
through a stand-in script that prints what nccl-tests prints.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
ENTRY = ROOT / "entrypoints"

pytest.importorskip("torch")


def rccl_check(*args: str, env_extra: dict | None = None, timeout: float = 240) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    env["PYTHONPATH"] = os.pathsep.join([str(ENTRY)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    env.update(env_extra or {})
    return subprocess.run([sys.executable, "-m", "toolbox_train.commands.rccl_check", *args], env=env,
                          capture_output=True, text=True, timeout=timeout)


def test_two_gloo_ranks_all_ops_correct(tmp_path):
    out = tmp_path / "res" / "rccl.json"
    r = rccl_check("--cpu", "--nproc", "2", "--sizes", "4K,256K,1M", "--iters", "2", "--json", str(out))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "dist-backend=gloo world_size=2 device=cpu" in r.stdout
    assert "all 9 results correct" in r.stdout
    data = json.loads(out.read_text())
    assert data["header"]["world_size"] == 2
    rows = data["results"]
    assert {(x["op"], x["bytes"]) for x in rows} == {
        (op, b) for op in ("all_reduce", "all_gather", "reduce_scatter") for b in (4096, 262144, 1048576)}
    for x in rows:
        assert x["ok"] and x["wrong"] == 0 and x["time_us"] > 0 and x["algbw_gbs"] > 0
        factor = 1.0 if x["op"] == "all_reduce" else 0.5  # 2(n-1)/n and (n-1)/n at n=2
        assert x["busbw_gbs"] == pytest.approx(x["algbw_gbs"] * factor)
    # No GPU: all_reduce_perf is not attempted in auto mode.
    assert "all_reduce_perf" not in r.stdout


def test_a_wrong_result_is_caught_and_fails_the_run(tmp_path):
    # A rank whose all_reduce comes back off by one in one element (what a broken RCCL build
    # or a bad link looks like); injected from outside through sitecustomize, on rank 1 only.
    (tmp_path / "sitecustomize.py").write_text(textwrap.dedent("""
        import os
        if os.environ.get("RANK") == "1":
            import torch.distributed as dist
            _orig = dist.all_reduce
            def _bad(t, *a, **k):
                res = _orig(t, *a, **k)
                if t.numel() > 1:
                    t.view(-1)[3] += 1
                return res
            dist.all_reduce = _bad
        """))
    r = rccl_check("--cpu", "--nproc", "2", "--sizes", "4K", "--ops", "all_reduce,all_gather",
                   "--iters", "1", env_extra={"PYTHONPATH": os.pathsep.join([str(ENTRY), str(tmp_path)])})
    assert r.returncode == 1, r.stdout + r.stderr
    line = next(ln for ln in r.stdout.splitlines() if ln.startswith("all_reduce"))
    assert "WRONG (1 elements)" in line
    assert next(ln for ln in r.stdout.splitlines() if ln.startswith("all_gather")).endswith("ok")
    assert "1 passed, 1 failed" in r.stdout


@pytest.mark.skipif(shutil.which("torchrun") is None and not (Path(sys.executable).parent / "torchrun").exists(),
                    reason="torchrun not installed")
def test_runs_under_torchrun(tmp_path):
    torchrun = shutil.which("torchrun") or str(Path(sys.executable).parent / "torchrun")
    env = {**os.environ, "PYTHONPATH": str(ENTRY), "GLOO_SOCKET_IFNAME": "lo"}
    r = subprocess.run([torchrun, "--standalone", "--nproc_per_node", "2",
                        "-m", "toolbox_train.commands.rccl_check", "--cpu", "--sizes", "64K", "--ops", "reduce_scatter",
                        "--iters", "1", "--timeout", "120"], env=env, capture_output=True, text=True, timeout=240, cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "world_size=2" in r.stdout and "all 1 results correct" in r.stdout


FAKE_PERF = """#!/bin/sh
# stand-in for rccl-tests' all_reduce_perf: prints what the real one prints
echo "# nThread 1 nGpus 1 minBytes $2 maxBytes $4 step: 2(factor) warmup iters: 5 iters: 20 validation: 1"
echo "#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong"
echo "        4096          1024     float     sum      -1    10.10    0.41    0.00      0    9.90    0.41    0.00      0"
echo "        8192          2048     float     sum      -1    10.50    0.78    0.00      {WRONG}    9.80    0.84    0.00      0"
echo "# Out of bounds values : {OOB} OK"
echo "# Avg bus bandwidth    : 0.00123"
"""


@pytest.mark.parametrize("wrong,oob,rc", [(0, 0, 0), (0, 3, 1), (2, 0, 1)])
def test_all_reduce_perf_output_is_judged(tmp_path, wrong, oob, rc):
    bindir = tmp_path / "bin"
    bindir.mkdir()
    fake = bindir / "all_reduce_perf"
    fake.write_text(FAKE_PERF.replace("{WRONG}", str(wrong)).replace("{OOB}", str(oob)))
    fake.chmod(0o755)
    r = rccl_check("--cpu", "--nproc", "1", "--sizes", "4K,8K", "--ops", "all_reduce", "--iters", "1",
                   "--all-reduce-perf", "on", env_extra={"PATH": f"{bindir}{os.pathsep}{os.environ['PATH']}"})
    assert r.returncode == rc, r.stdout + r.stderr
    assert f"running {fake} -b 4096 -e 8192 -f 2 -g 1 -c 1" in r.stdout
    if rc == 0:
        assert "all_reduce_perf ok, 2 sizes, avg bus bandwidth 0.00123 GB/s" in r.stdout
    elif oob:
        assert "3 out-of-bounds values" in r.stderr
    else:
        assert "#wrong column non-zero at 1 size(s)" in r.stderr


def test_bad_input_exits_2():
    r = rccl_check("--cpu", "--sizes", "4Q")
    assert r.returncode == 2 and "size '4Q'" in r.stderr
    r = rccl_check("--cpu", "--ops", "all_reduce,broadcast")
    assert r.returncode == 2 and "unknown broadcast" in r.stderr
    r = rccl_check("--cpu", "--min-bytes", "1M", "--max-bytes", "4K")
    assert r.returncode == 2 and "larger than --max-bytes" in r.stderr
    r = rccl_check("--cpu", "--dist-backend", "nccl", "--nproc", "1", "--sizes", "4K")
    assert r.returncode == 2 and "needs a visible GPU" in r.stderr
