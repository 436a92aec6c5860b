"""docs/bench/vision_rows.py (issue 44's vision rows) on the CPU with its tiny shapes, Gemma 3's and Qwen3-VL's:
the references (the bare loop, TRL's SFTTrainer) and a finetune row with a bench variant and a log every 4th
step each time their timed steps and count their tokens, so the device call's rows do not die on a bench bug;
HOSTSPY=1's sampler (host_spy.py) covers each row's timed steps and its summary adds up; a log interval that
leaves the timed window's ends unlogged is one line, not a KeyError after the run."""

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
           "HF_HUB_OFFLINE": "1", "VR_TIMED": "4", "VR_WORK": str(tmp_path / "work"), "HOSTSPY": "1",
           "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])}  # py-spy
    paths = ("bare trl finetune:hf:lora:liger_tower=false,output.logging_steps=4 finetune:hf:lora:output.logging_steps=3 "
             "finetune:hf:lora:output.logging_steps=x")
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
            # HOSTSPY=1: py-spy sampled the main thread over the timed steps, inside the row's own step code
            spy = r["hostspy"]
            # (nonblocking samples can catch a stack mid-change: most, not all, pass through the bench's frames)
            assert spy["samples"] > 0 and spy["coverage"] > 0 and spy["window_s"] > 0, spy
            assert spy["under"]["bench"] > 0.5 and abs(sum(spy["self"].values()) - 1) < 0.01, spy
            assert (tmp_path / "out" / f"hostspy-{shape}-{path.replace(':', '-').replace(',', '-').replace('=', '')}.txt"
                    ).is_file()
        bad = rows[shape, paths.split()[3]]
        assert bad["error"].startswith("exit "), bad
        log = (tmp_path / "out" / f"{shape}-finetune-hf-lora-output.logging_steps3.log").read_text()
        assert log.strip().splitlines()[-1] == ("output.logging_steps=3: the warm-up steps (4) and warm-up + VR_TIMED "
                                                "(8) must be logged steps (multiples of it)"), log[-2000:]
        assert "Traceback" not in log
        # not a number of steps: its own line, exit 2, no run folder
        assert rows[shape, paths.split()[4]]["error"] == f"exit 2, see {shape}-finetune-hf-lora-output.logging_stepsx.log"
        log = (tmp_path / "out" / f"{shape}-finetune-hf-lora-output.logging_stepsx.log").read_text()
        assert log.strip().splitlines()[-1] == "output.logging_steps=x: a whole number of steps, 1 or more", log[-2000:]
        assert not list((tmp_path / "work").glob(f"run-{shape}-*logging_stepsx"))


def test_host_spy_sums_the_main_thread_by_package():
    """host_spy.summarize on py-spy's raw format (`--threads --full-filenames`): other threads left out, each
    sample's innermost package (`self`), every package on its stack (`under`), the innermost frames (`top`)."""
    sys.path.insert(0, str(ROOT / "docs/bench"))
    import host_spy

    sp = "/v/lib/python3.12/site-packages"
    raw = "\n".join([
        f"thread (7): MainThread;train (/w/docs/bench/vision_rows.py:9);compute_loss ({sp}/trl/trainer/sft.py:5);"
        f"forward ({sp}/torch/nn/modules/linear.py:134) 30",
        f"thread (7): MainThread;train (/w/docs/bench/vision_rows.py:9);compute_loss ({sp}/trl/trainer/sft.py:5);"
        f"apply ({sp}/liger_kernel/ops/layer_norm.py:20);run ({sp}/triton/runtime/jit.py:600) 10",
        f"thread (7): MainThread;train (/w/docs/bench/vision_rows.py:9);item (/w/entrypoints/toolbox_train/x.py:3) 10",
        f"thread (8): Thread-1 (_pin_memory_loop);_pin_memory_loop ({sp}/torch/utils/data/_utils/pin_memory.py:1) 99",
        "garbage line"])
    s = host_spy.summarize(raw, seconds=0.1)
    assert s["samples"] == 50 and s["coverage"] == 1.0
    assert s["self"] == {"torch.nn": 0.6, "triton": 0.2, "toolbox_train": 0.2}
    assert s["under"] == {"bench": 1.0, "trl": 0.8, "torch.nn": 0.6, "liger_kernel": 0.2, "triton": 0.2,
                          "toolbox_train": 0.2}
    assert s["top"][0] == ["torch/nn/modules/linear.py:134 forward", 0.6]
