"""Fuzzing `finetune --resume` over damaged checkpoint folders and changed configs (issue 23).

Properties, for every example: the checks end in exit 0 (a checkpoint that belongs to this config
is taken, or a damaged one is skipped with a warning) or in exit 2 with one line that names the
checkpoint or the config; never exit 1, a traceback or a hang (a FIFO among the files); the output
folder is byte-identical afterwards. As in test_fuzz_train.py the run stops where the checks end
(`prepare_output`, the first thing that writes, raises ChecksPassed). Derandomized, small budget;
TOOLBOX_FUZZ=random explores, TOOLBOX_FUZZ_RESUME_EXAMPLES=N sets how many.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from helpers.tiny import train_config, write_dataset
from toolbox_train.commands import finetune

EXAMPLES = int(os.environ.get("TOOLBOX_FUZZ_RESUME_EXAMPLES", "20"))
FUZZ = settings(max_examples=EXAMPLES, deadline=None, database=None,
                derandomize=os.environ.get("TOOLBOX_FUZZ") != "random",
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                       HealthCheck.function_scoped_fixture])


class ChecksPassed(BaseException):
    pass


@pytest.fixture(autouse=True)
def _stop_before_writing(monkeypatch):
    def stop(*a, **kw):
        raise ChecksPassed

    monkeypatch.setattr(finetune, "prepare_output", stop)


@pytest.fixture(scope="module")
def world(tmp_path_factory, tiny_models):
    d = tmp_path_factory.mktemp("fuzz-resume")
    data = write_dataset(d / "d.jsonl", "text", n=24)
    cfg = train_config(tiny_models("llama"), data, d / "run", **{
        "method": "lora", "lora.r": 4, "train.max_steps": 6, "output.save_steps": 1,
        "output.keep_checkpoints": 2})
    os.environ["TOOLBOX_STOP_AFTER_STEP"] = "2"
    try:
        finetune.run(cfg)
    finally:
        del os.environ["TOOLBOX_STOP_AFTER_STEP"]
    return {"dir": d, "cfg": cfg, "run": d / "run", "qwen": tiny_models("qwen3")}


FILES = ["trainer_state.json", "toolbox_checkpoint.json", "adapter_model.safetensors", "adapter_config.json",
         "optimizer.pt", "scheduler.pt", "rng_state.pth"]
DAMAGE = st.tuples(st.sampled_from(["checkpoint-2", "checkpoint-1"]), st.sampled_from(FILES),
                   st.sampled_from(["truncate", "garbage", "empty", "delete", "list", "fifo", "identity"]),
                   st.integers(0, 3000))
CHANGES = st.sampled_from([{}, {}, {"method": "full"}, {"lora.r": 8}, {"lora.target_modules": ["q_proj"]},
                           {"lora.alpha": 64}, {"train.learning_rate": 1e-4}, {"model.path": "QWEN"},
                           {"model.revision": "v2"}])
IDENTITY = st.dictionaries(st.sampled_from(["model", "revision", "method", "backend"]),
                           st.one_of(st.none(), st.integers(), st.text(max_size=8), st.sampled_from(["lora", "hf"])),
                           max_size=4)


def _snapshot(d: Path) -> dict:
    return {str(p.relative_to(d)): p.read_bytes() if p.is_file() else None for p in sorted(d.rglob("*"))
            if not p.is_fifo()}


@FUZZ
@given(damages=st.lists(DAMAGE, max_size=2), change=CHANGES, identity=IDENTITY)
@example(damages=[("checkpoint-2", "trainer_state.json", "fifo", 0)], change={}, identity={})  # it would hang
@example(damages=[("checkpoint-2", "optimizer.pt", "truncate", 100)], change={"lora.r": 8}, identity={})
@example(damages=[("checkpoint-2", "toolbox_checkpoint.json", "identity", 0)], change={},
         identity={"method": "full", "backend": "unsloth"})
def test_fuzz_resume(world, damages, change, identity):
    out = world["dir"] / "out"
    shutil.rmtree(out, ignore_errors=True)
    shutil.copytree(world["run"], out)
    for cp, name, how, cut in damages:
        f = out / "checkpoints" / cp / name
        if how == "truncate" and f.is_file():
            f.write_bytes(f.read_bytes()[:cut])
        elif how == "garbage":
            f.unlink(missing_ok=True)
            f.write_bytes(b"\x00\xffjunk{" * (cut % 5))
        elif how == "empty":
            f.unlink(missing_ok=True)
            f.write_bytes(b"")
        elif how == "delete":
            f.unlink(missing_ok=True)
        elif how == "list":
            f.unlink(missing_ok=True)
            f.write_text("[1, 2]\n")
        elif how == "fifo":
            f.unlink(missing_ok=True)
            os.mkfifo(f)
        elif how == "identity":
            (f.parent / "toolbox_checkpoint.json").write_text(json.dumps(identity))
    cfg = json.loads(json.dumps(world["cfg"]))
    cfg["output"]["dir"] = str(out)
    for k, v in change.items():
        node = cfg
        *parents, last = k.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[last] = str(world["qwen"]) if v == "QWEN" else v
    path = world["dir"] / "t.yaml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    before = _snapshot(out)
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            code = finetune.main(["--config", str(path), "--resume"])
        except ChecksPassed:
            code = 0
    err = err.getvalue()
    assert code in (0, 2), (code, err)
    assert "Traceback" not in err, err
    if code == 2:
        msg = err[err.index("finetune: error: "):].strip()
        assert "\n" not in msg and (str(out) in msg or str(path) in msg or "model.revision" in msg), err
    assert _snapshot(out) == before
