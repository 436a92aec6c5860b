"""finetune under input that parses but cannot train, a checkpoint of another config, a loss
that becomes NaN, and SIGTERM (issue 23): refused with the field's file:line and exit 2 before
anything is written, or stopped with one line and the checkpoints kept."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from safetensors.torch import load_file

from helpers.tiny import train_config, write_dataset, write_train_config
from toolbox_train.runs import checkpoints
from toolbox_train.commands import finetune

ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONPATH": f"{ROOT / 'entrypoints'}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}


def _snapshot(d: Path) -> dict:
    return {str(p.relative_to(d)): p.read_bytes() if p.is_file() else None for p in sorted(d.rglob("*"))} \
        if d.exists() else None


def _main(argv, capsys) -> tuple[int, str]:
    code = finetune.main(argv)
    err = capsys.readouterr().err
    assert "Traceback" not in err, err
    return code, err


@pytest.fixture
def data(tmp_path):
    return write_dataset(tmp_path / "d.jsonl", "text", n=20)


def _line_of(cfg: Path, key: str) -> int:
    return next(i for i, ln in enumerate(cfg.read_text().splitlines(), 1) if ln.strip().startswith(f"{key}:"))


@pytest.mark.parametrize("key, value, expect", [
    ("train.learning_rate", float("inf"), "train.learning_rate: not a finite number"),
    ("train.learning_rate", 1e30, "train.learning_rate: 1e+30 cannot train"),
    ("train.learning_rate", 5.0, "train.learning_rate: 5.0 cannot train"),
    ("train.epochs", float("inf"), "train.epochs: not a finite number"),
    ("train.max_steps", 0, "train.max_steps: 0: at least 1, or -1"),
    ("train.max_steps", -5, "train.max_steps: -5: at least 1, or -1"),
    ("train.max_grad_norm", float("nan"), "train.max_grad_norm: not a finite number"),
])
def test_numbers_that_cannot_train_are_refused_at_their_line(tmp_path, tiny_model, data, capsys, key, value, expect):
    out = tmp_path / "out"
    cfg = write_train_config(tmp_path / "t.yaml", tiny_model, data, out, **{key: value})
    code, err = _main(["--config", str(cfg)], capsys)
    assert code == 2, err
    line = _line_of(cfg, key.split(".")[-1])
    assert err.strip() == err.strip().splitlines()[0] and f"{cfg}:{line}: {expect}" in err, err
    assert not out.exists()


def test_schema_errors_are_one_line_and_a_set_value_is_blamed_on_set(tmp_path, tiny_model, data, capsys):
    cfg = write_train_config(tmp_path / "t.yaml", tiny_model, data, tmp_path / "out",
                             **{"train.max_steps": 0, "train.epochs": float("inf")})
    code, err = _main(["--config", str(cfg)], capsys)
    msg = err.strip().splitlines()[-1]
    assert code == 2 and "train.max_steps: 0" in msg and "train.epochs: not a finite number" in msg, err
    cfg = write_train_config(tmp_path / "t.yaml", tiny_model, data, tmp_path / "out")
    code, err = _main(["--config", str(cfg), "--set", "train.learning_rate=.inf"], capsys)
    assert code == 2 and "error: --set: train.learning_rate: not a finite number" in err, err


@pytest.mark.parametrize("item, expect", [
    ("nosuch.key=1", "--set: nosuch: unknown key (from --set nosuch.key=1)"),  # the section --set made up
    ("train.nosuch=1", "--set: train.nosuch: unknown key (from --set train.nosuch=1)"),
    ("train.max_steps=abc", "--set: train.max_steps: Input should be a valid integer"),
    # a field of several types: once, with every form (it printed each union branch's message, loc suffix and all)
    ("train.per_device_batch_size=abc", "--set: train.per_device_batch_size: expected an integer or 'auto' (got 'abc')"),
    ("train.optimizer=nope", "--set train.optimizer=nope: train.optimizer: 'nope' is not one of"),  # a later check
])
def test_a_set_error_names_the_set_item_not_the_config_file(tmp_path, tiny_model, data, capsys, item, expect):
    out = tmp_path / "out"
    cfg = write_train_config(tmp_path / "t.yaml", tiny_model, data, out)
    code, err = _main(["--config", str(cfg), "--set", "train.seed=1", "--set", item], capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert expect in err and f"--set {item}" in err and str(cfg) not in err, err
    assert not out.exists()


def test_a_field_of_several_types_is_named_once_at_its_line(tmp_path, tiny_model, data, capsys):
    out = tmp_path / "out"
    cfg = write_train_config(tmp_path / "t.yaml", tiny_model, data, out,
                             **{"train.gradient_checkpointing": "maybe", "train.router_aux_loss_coef": float("inf")})
    code, err = _main(["--config", str(cfg)], capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1 and not out.exists(), err
    assert err.strip() == (
        f"finetune: error: {cfg}:{_line_of(cfg, 'gradient_checkpointing')}: train.gradient_checkpointing: expected "
        f"true or false or 'unsloth' or 'auto' (got 'maybe'); {cfg}:{_line_of(cfg, 'router_aux_loss_coef')}: "
        "train.router_aux_loss_coef: expected 'auto' or a finite number (got inf)"), err


def test_an_eval_split_leaving_no_training_rows_is_refused(tmp_path, tiny_model, data, capsys):
    out = tmp_path / "out"
    cfg = write_train_config(tmp_path / "t.yaml", tiny_model, data, out, **{"data.eval_split": 0.99})
    code, err = _main(["--config", str(cfg)], capsys)
    assert code == 2 and f"{cfg}:{_line_of(cfg, 'eval_split')}: data.eval_split: 0.99 of 20 rows" in err, err
    assert "no training rows" in err and not out.exists()


@pytest.mark.parametrize("field, value, expect", [
    ("data.path", "/tmp/a\x00b.jsonl", "contains a NUL byte"),
    ("data.path", "/tmp/" + "x" * 300 + ".jsonl", "the OS limit is"),
    ("data.eval_path", "/tmp" + "/abcdefgh" * 600, "bytes long; the OS limit is"),
    ("model.path", "/tmp/" + "m" * 300, "the OS limit is"),
    ("output.dir", "/tmp/" + "o" * 300, "the OS limit is"),
])
def test_paths_no_os_can_open_are_refused(tmp_path, tiny_model, data, capsys, field, value, expect):
    cfg = write_train_config(tmp_path / "t.yaml", tiny_model, data, tmp_path / "out", **{field: value})
    code, err = _main(["--config", str(cfg)], capsys)
    assert code == 2 and f"{field}: " in err and expect in err and len(err.strip().splitlines()) == 1, err


def test_a_fifo_as_data_or_config_is_refused_not_read(tmp_path, tiny_model, capsys):
    fifo = tmp_path / "d.jsonl"
    os.mkfifo(fifo)  # opening it for reading would block until a writer comes: the test would hang
    cfg = write_train_config(tmp_path / "t.yaml", tiny_model, fifo, tmp_path / "out")
    code, err = _main(["--config", str(cfg)], capsys)
    assert code == 2 and f"data.path: {fifo}: a FIFO (named pipe), not a regular file" in err, err
    os.mkfifo(tmp_path / "c.yaml")
    code, err = _main(["--config", str(tmp_path / "c.yaml")], capsys)
    assert code == 2 and "c.yaml: a FIFO (named pipe), not a regular file" in err, err


# ---------------------------------------------------------------- resume from another config

def _stopped_run(tmp_path, tiny_model, monkeypatch, **over) -> tuple[Path, dict]:
    data = write_dataset(tmp_path / "r.jsonl", "text", n=24)
    out = tmp_path / "run"
    cfg = train_config(tiny_model, data, out, **{"method": "lora", "lora.r": 4, "train.max_steps": 6,
                                                 "output.save_steps": 2, **over})
    monkeypatch.setenv("TOOLBOX_STOP_AFTER_STEP", "2")
    finetune.run(cfg)
    monkeypatch.delenv("TOOLBOX_STOP_AFTER_STEP")
    return out, cfg


@pytest.mark.parametrize("change, expect", [
    ({"method": "full"}, "method 'lora' (this config: 'full')"),
    ({"lora.r": 8}, "parameter shape(s) differ"),
    ({"lora.target_modules": ["q_proj"]}, "parameter(s) this config does not have"),
    ({"model.path": "OTHER"}, "model "),
])
def test_resume_from_a_checkpoint_of_another_config_changes_nothing(tmp_path, tiny_models, monkeypatch, capsys,
                                                                    change, expect):
    out, cfg = _stopped_run(tmp_path, tiny_models("llama"), monkeypatch)
    if change.get("model.path") == "OTHER":
        change = {"model.path": str(tiny_models("qwen3"))}
    for k, v in change.items():
        node = cfg
        *parents, last = k.split(".")
        for part in parents:
            node = node[part]
        node[last] = v
    path = tmp_path / "t.yaml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    before = _snapshot(out)
    capsys.readouterr()
    code, err = _main(["--config", str(path), "--resume"], capsys)
    assert code == 2, err
    assert f"--resume: {out / 'checkpoints' / 'checkpoint-2'} is not a checkpoint of this config" in err, err
    assert expect in err and err.strip().splitlines()[-1].startswith("finetune: error: --resume"), err
    assert _snapshot(out) == before


def test_resume_of_the_same_config_still_works(tmp_path, tiny_model, monkeypatch):
    out, cfg = _stopped_run(tmp_path, tiny_model, monkeypatch)
    ident = json.loads((out / "checkpoints" / "checkpoint-2" / "toolbox_checkpoint.json").read_text())
    assert ident["method"] == "lora" and ident["backend"] == "hf"
    assert finetune.run(cfg, resume=True)["steps"] == 6


# ---------------------------------------------------------------- a loss that becomes NaN

def test_a_nan_loss_stops_the_run_and_keeps_the_last_good_checkpoint(tmp_path, tiny_model, monkeypatch, capsys):
    data = write_dataset(tmp_path / "r.jsonl", "text", n=24)
    out = tmp_path / "run"
    cfg = write_train_config(tmp_path / "t.yaml", tiny_model, data, out,
                             **{"train.max_steps": 8, "output.save_steps": 2, "output.keep_checkpoints": 5})
    # Test hook: after step 3 a weight becomes NaN (what a diverging run does), so step 4's loss is NaN.
    monkeypatch.setenv("TOOLBOX_TEST_POISON_AFTER_STEP", "3")
    code, err = _main(["--config", str(cfg)], capsys)
    assert code == 1, err
    last = err.strip().splitlines()[-1]
    assert last.startswith("finetune: error: the loss became NaN/inf at step 4"), err
    assert str(out / "checkpoints" / "checkpoint-2") in last and "--resume" in last
    assert [p.name for p in checkpoints.listed(out / "checkpoints")] == ["checkpoint-2"]
    assert not (out / "summary.json").exists() and not (out / "model.safetensors").exists()
    w = load_file(str(out / "checkpoints" / "checkpoint-2" / "model.safetensors"))
    assert all(t.isfinite().all() for t in w.values())


# ---------------------------------------------------------------- SIGTERM

def test_sigterm_stops_saying_so_and_resumes_to_the_same_weights(tmp_path, tiny_model):
    data = write_dataset(tmp_path / "r.jsonl", "text", n=24)
    over = {"train.max_steps": 6, "output.save_steps": 2, "train.lr_scheduler": "cosine"}
    ref_cfg = write_train_config(tmp_path / "ref.yaml", tiny_model, data, tmp_path / "ref", **over)
    cfg = write_train_config(tmp_path / "t.yaml", tiny_model, data, tmp_path / "cut", **over)
    cmd = [sys.executable, "-m", "toolbox_train.commands.finetune", "--config"]
    assert subprocess.run(cmd + [str(ref_cfg)], env=ENV, capture_output=True, timeout=600).returncode == 0
    # Test hook: the process sends itself SIGTERM (as podman stop would) at the end of step 3.
    r = subprocess.run(cmd + [str(cfg)], env={**ENV, "TOOLBOX_TEST_SIGNAL_AFTER_STEP": "3"},
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 128 + signal.SIGTERM, r.stderr
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith("finetune: terminated (SIGTERM)") and "--resume" in last, r.stderr
    assert "Traceback" not in r.stderr
    r = subprocess.run(cmd + [str(cfg), "--resume"], env=ENV, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    a, b = load_file(str(tmp_path / "ref" / "model.safetensors")), load_file(str(tmp_path / "cut" / "model.safetensors"))
    assert a.keys() == b.keys() and max((a[k] - b[k]).abs().max().item() for k in a) <= 1e-6


@pytest.mark.slow
def test_launch_passes_sigterm_on_to_the_ranks_and_the_run_resumes(tmp_path, tiny_model):
    data = write_dataset(tmp_path / "r.jsonl", "text", n=24)
    out = tmp_path / "out"
    cfg = write_train_config(tmp_path / "t.yaml", tiny_model, data, out,
                             **{"train.max_steps": 6, "output.save_steps": 2})
    cmd = [sys.executable, "-m", "toolbox_train.commands.launch", "--strategy", "ddp", "--nproc", "1", "--cpu",
           "--", "finetune", "--config", str(cfg)]
    env = {**ENV, "OMP_NUM_THREADS": "1"}
    for k in ("WORLD_SIZE", "RANK", "LOCAL_RANK"):
        env.pop(k, None)
    # Test hook: after step 3 the rank sends SIGTERM to launch (as podman stop would) and waits for
    # it to come back through torchrun.
    r = subprocess.run(cmd, env={**env, "TOOLBOX_TEST_SIGNAL_AFTER_STEP": "3", "TOOLBOX_TEST_SIGNAL_TARGET": "launch"},
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 128 + signal.SIGTERM, r.stderr[-3000:]
    assert "finetune: terminated (SIGTERM)" in r.stderr  # the rank got it, through torchrun
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith("launch: terminated (SIGTERM): passed on to the ranks"), r.stderr[-3000:]
    assert [p.name for p in checkpoints.listed(out / "checkpoints")][-1] == "checkpoint-2"
    assert not (out / "summary.json").exists()
    r = subprocess.run(cmd + ["--resume"], env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    steps = [json.loads(x)["step"] for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert steps == list(range(1, 7))


# ---------------------------------------------------------------- a full disk

@pytest.mark.parametrize("size", ["700k", "870k"])  # model.safetensors (safetensors) / optimizer.pt (torch.save) fails
def test_a_full_disk_while_saving_a_checkpoint_keeps_the_previous_one(tmp_path, tiny_model, capsys, size):
    from helpers.mounts import resize, tmpfs

    data = write_dataset(tmp_path / "r.jsonl", "text", n=24)
    # A full fine-tune's checkpoint of the tiny model is ~550 KiB: the first fits, the second does not.
    with tmpfs(tmp_path / "disk", size) as disk:
        out = disk / "out"
        cfg = write_train_config(tmp_path / "t.yaml", tiny_model, data, out,
                                 **{"train.max_steps": 4, "output.save_steps": 2, "output.keep_checkpoints": 1})
        code, err = _main(["--config", str(cfg)], capsys)
        assert code == 1, err
        last = err.strip().splitlines()[-1]
        cpd = out / "checkpoints"
        assert last.startswith(f"finetune: error: disk full at {cpd} while saving checkpoint-4 (No space left"), err
        assert f"{cpd / 'checkpoint-2'} is the newest whole checkpoint" in last and "internal error" not in err
        assert not list(cpd.glob(".partial*")), list(cpd.iterdir())  # the partial copy is gone
        assert [p.name for p in checkpoints.listed(cpd)] == ["checkpoint-2"]
        assert checkpoints.problem(cpd / "checkpoint-2") is None
        resize(disk, "8m")  # space freed: the run resumes from the whole checkpoint to its end
        code, err = _main(["--config", str(cfg), "--resume"], capsys)
        assert code == 0, err
        assert f"resuming from {cpd / 'checkpoint-2'}" in err
        steps = [json.loads(x)["step"] for x in (out / "metrics.jsonl").read_text().splitlines()]
        assert steps == [1, 2, 3, 4]


def test_a_full_disk_while_saving_the_final_model_leaves_none_of_it(tmp_path, tiny_model, capsys):
    """The final model is the largest file a run writes: on a full disk the error names the run folder and
    the whole checkpoint, none of the model's files stay (config.json, a cut model.safetensors), and once
    space is freed `--resume` saves the model from that checkpoint."""
    from helpers.mounts import resize, tmpfs

    data = write_dataset(tmp_path / "r.jsonl", "text", n=24)
    # The tiny model's checkpoint (~550 KiB, optimizer included) fits; the final model (~160 KiB) does not.
    with tmpfs(tmp_path / "disk", "660k") as disk:
        out = disk / "out"
        cfg = write_train_config(tmp_path / "t.yaml", tiny_model, data, out,
                                 **{"train.max_steps": 2, "output.save_steps": 2, "output.keep_checkpoints": 1})
        code, err = _main(["--config", str(cfg)], capsys)
        assert code == 1, err
        last = err.strip().splitlines()[-1]
        cp = out / "checkpoints" / "checkpoint-2"
        assert last.startswith(f"finetune: error: disk full at {out} while saving the final model (No space left"), err
        assert f"{cp} is the newest whole checkpoint" in last and "internal error" not in err
        assert sorted(os.listdir(out)) == ["checkpoints", "config.resolved.yaml", "metrics.jsonl"]
        resize(disk, "8m")
        code, err = _main(["--config", str(cfg), "--resume"], capsys)
        assert code == 0, err
        saved, at_checkpoint = load_file(out / "model.safetensors"), load_file(cp / "model.safetensors")
        assert saved.keys() == at_checkpoint.keys() and all(saved[k].equal(at_checkpoint[k]) for k in saved)
