"""docs/bench/grpo_rows.py (issue 32's GRPO generation share) on the CPU with a tiny model: it finds
TRL's generation block in every step (TRL 1.15's profiling names; a TRL that renamed them would
leave the share at 0) and the time it reports inside generate is a real part of each step; issue 46's
tool row makes its tool calls under each sampler."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_grpo_rows_times_generate_inside_each_step(tmp_path):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "entrypoints"), os.environ.get("PYTHONPATH", "")]),
           "HF_HUB_OFFLINE": "1", "DEVICE": "cpu", "PROMPT": "12", "COMPLETION": "12", "GENS": "4", "BATCH": "8",
           "WARMUP": "1", "STEPS": "2", "HOSTSPY": "1",
           "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])}  # py-spy
    p = subprocess.run([sys.executable, str(ROOT / "docs/bench/grpo_rows.py"), str(tmp_path / "out"),
                        str(tmp_path / "work"), "--shapes", "tiny-llama"], capture_output=True, text=True, env=env,
                       timeout=600)
    assert p.returncode == 0, p.stderr
    (row,) = json.loads((tmp_path / "out" / "grpo-rows.json").read_text())
    log = (tmp_path / "out" / "grpo-tiny-llama-transformers-r0.log").read_text()
    assert "error" not in row, log
    # HOSTSPY=1: py-spy sampled the timed steps (host_spy.py), generate's frames among them
    assert row["hostspy"]["samples"] > 0 and row["hostspy"]["under"].get("trl", 0) > 0.5, row["hostspy"]
    assert (tmp_path / "out" / "hostspy-tiny-llama-transformers.txt").is_file()
    assert row["repeat"] == 0 and row["sampler_args"]["cache_implementation"] is None  # TRL's default generate
    assert "transformers.generate" in row["blocks_seen"] and row["settings"]["COMPLETION"] == 12
    assert [s["step"] for s in row["per_step"]] == [1, 2, 3] and row["timed_steps"] == 2
    for s in row["per_step"]:  # one generation per step (accumulation 1), inside it and inside _prepare_inputs
        assert 0 < s["generate_s"] <= s["prepare_inputs_s"] < s["step_s"], s
    assert 0 < row["generate_share"] <= row["generation_and_scoring_share"] < 1
    # 8 completions of 12 tokens per timed step (a random-init model does not stop early)
    timed_gen = sum(s["generate_s"] for s in row["per_step"][1:])
    assert abs(row["generated_tokens_per_s"] - 8 * 12 * 2 / timed_gen) < 0.1 * row["generated_tokens_per_s"]


def test_the_tool_row_makes_its_scripted_call_under_each_sampler(tmp_path):
    """Issue 46's tool row (docs/bench/grpo_tools_row.py) scripts the model's first turn where each sampler's
    turn is: TRL's `_generate_single_turn` and the compiled loop's override of it. Each timed step then calls
    add 8 times (half of them failing by construction) in two turns; a row with no call is an error."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "entrypoints"), os.environ.get("PYTHONPATH", "")]),
           "HF_HUB_OFFLINE": "1", "DEVICE": "cpu", "PROMPT": "16", "COMPLETION": "200", "GENS": "4", "BATCH": "8",
           "WARMUP": "1", "STEPS": "1"}
    p = subprocess.run([sys.executable, str(ROOT / "docs/bench/grpo_rows.py"), str(tmp_path / "out"),
                        str(tmp_path / "work"), "--shapes", "tiny-llama", "--generation",
                        "tools:compiled,tools:transformers"], capture_output=True, text=True, env=env, timeout=600)
    assert p.returncode == 0, p.stderr
    rows = json.loads((tmp_path / "out" / "grpo-rows.json").read_text())
    assert [r["generation"] for r in rows] == ["tools:compiled", "tools:transformers"], rows
    for r in rows:
        assert "error" not in r and "error" not in r["tools"], r
        assert r["sampler"] == r["generation"].removeprefix("tools:"), r
        mean = r["tools"]["mean"]
        assert (mean["tools/calls"], mean["tools/failures"], mean["tools/turns"]) == (8, 4, 2), mean
