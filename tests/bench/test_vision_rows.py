"""docs/bench/vision_rows.py (issue 44's vision rows) on the CPU with its tiny shapes, Gemma 3's and Qwen3-VL's:
the references (the bare loop, TRL's SFTTrainer) and a finetune row with a bench variant and a log every 4th
step each time their timed steps and count their tokens, so the device call's rows do not die on a bench bug;
a log interval that leaves the timed window's ends unlogged is one line, not a KeyError after the run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_rows_run_on_the_tiny_shapes(tmp_path):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "entrypoints"),
                                                        os.environ.get("PYTHONPATH", "")]),
           "HF_HUB_OFFLINE": "1", "VR_TIMED": "4", "VR_WORK": str(tmp_path / "work")}
    paths = "bare trl finetune:hf:lora:liger_tower=false,output.logging_steps=4 finetune:hf:lora:output.logging_steps=3"
    p = subprocess.run([sys.executable, str(ROOT / "docs/bench/vision_rows.py"), str(tmp_path / "out"),
                        "--shapes", "tiny,tiny-qwen3-vl", "--paths", paths], capture_output=True, text=True, env=env,
                       timeout=900)
    assert p.returncode == 0, p.stderr[-3000:]
    rows = {(r["shape"], r["path"]): r for r in json.loads((tmp_path / "out" / "vision-rows.json").read_text())}
    for shape in ("tiny", "tiny-qwen3-vl"):
        for path in paths.split()[:3]:
            r = rows[shape, path]
            assert "error" not in r, (r, sorted(x.name for x in (tmp_path / "out").iterdir()))
            assert r["timed_steps"] == 4 and r["tokens_per_s"] > 0 and r["timed_tokens"] > 4 * 4 * 16, r
        bad = rows[shape, paths.split()[3]]
        assert bad["error"].startswith("exit "), bad
        log = (tmp_path / "out" / f"{shape}-finetune-hf-lora-output.logging_steps3.log").read_text()
        assert log.strip().splitlines()[-1] == ("output.logging_steps=3: the warm-up steps (4) and warm-up + VR_TIMED "
                                                "(8) must be logged steps (multiples of it)"), log[-2000:]
        assert "Traceback" not in log
