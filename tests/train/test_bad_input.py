"""Every bad input: a clear message naming the file/field/line, exit 2, before heavy work,
nothing existing overwritten."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from helpers.tiny import write_dataset, write_train_config
from toolbox_train.commands import launch
from toolbox_train.commands import finetune

ROOT = Path(__file__).resolve().parents[2]


def _snapshot(d: Path) -> dict[str, bytes]:
    return {str(p.relative_to(d)): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()} if d.exists() else {}


@pytest.fixture
def setup(tmp_path, tiny_model):
    data = write_dataset(tmp_path / "d.jsonl", "text", n=16)
    out = tmp_path / "out"
    return tmp_path, tiny_model, data, out


def _check(capsys, argv, expect, out, entry=finetune.main):
    before = _snapshot(out)
    assert entry(argv) == 2
    err = capsys.readouterr().err
    assert expect in err, err
    assert "Traceback" not in err
    assert _snapshot(out) == before  # nothing written, nothing overwritten


def test_missing_model_path(setup, capsys):
    tmp, model, data, out = setup
    cfg = write_train_config(tmp / "t.yaml", tmp / "no-model", data, out)
    _check(capsys, ["--config", str(cfg)], f"model.path: {tmp / 'no-model'}: no such folder", out)
    cfg = write_train_config(tmp / "t.yaml", tmp, data, out)  # a folder, but not a model
    _check(capsys, ["--config", str(cfg)], "no config.json (not a model folder)", out)


def test_missing_dataset_path(setup, capsys):
    tmp, model, data, out = setup
    cfg = write_train_config(tmp / "t.yaml", model, tmp / "missing.jsonl", out)
    _check(capsys, ["--config", str(cfg)], "data.path: ", out)


def test_malformed_jsonl_line(setup, capsys):
    tmp, model, data, out = setup
    text = data.read_text().splitlines()
    text[6] = "{oops"
    data.write_text("\n".join(text) + "\n")
    cfg = write_train_config(tmp / "t.yaml", model, data, out)
    _check(capsys, ["--config", str(cfg)], f"{data}:7: malformed JSON line", out)


def test_unknown_config_keys(setup, capsys):
    tmp, model, data, out = setup
    cfg = write_train_config(tmp / "t.yaml", model, data, out, **{"train.epoch": 3, "output.save_every": 5})
    before = _snapshot(out)
    assert finetune.main(["--config", str(cfg)]) == 2
    err = capsys.readouterr().err
    lines = cfg.read_text().splitlines()
    at = {k: lines.index(f"  {k}: {v}") + 1 for k, v in (("epoch", 3), ("save_every", 5))}
    assert f"{cfg}:{at['epoch']}: train.epoch: unknown key" in err
    assert f"{cfg}:{at['save_every']}: output.save_every: unknown key" in err
    assert _snapshot(out) == before
    _check(capsys, ["--config", str(cfg.with_name("nope.yaml"))], "config file not found", out)


def test_seq_length_above_model_max(setup, capsys):
    tmp, model, data, out = setup
    cfg = write_train_config(tmp / "t.yaml", model, data, out, **{"data.max_seq_length": 4096})
    _check(capsys, ["--config", str(cfg)], "data.max_seq_length: 4096 is above the model's maximum (256", out)


def test_non_empty_output_without_resume_or_overwrite(setup, capsys):
    tmp, model, data, out = setup
    out.mkdir()
    (out / "precious.txt").write_text("keep me")
    cfg = write_train_config(tmp / "t.yaml", model, data, out)
    _check(capsys, ["--config", str(cfg)], f"output.dir: {out}: not empty (precious.txt)", out)
    _check(capsys, ["--config", str(cfg), "--resume", "--overwrite"], "exclude each other", out)
    # --overwrite does start over.
    assert finetune.main(["--config", str(cfg), "--overwrite"]) == 0
    assert not (out / "precious.txt").exists() and (out / "metrics.jsonl").exists()


def test_fsdp_with_unsloth_refused_by_launch(setup, capsys):
    tmp, model, data, out = setup
    cfg = write_train_config(tmp / "t.yaml", model, data, out, backend="unsloth")
    _check(capsys, ["--strategy", "fsdp", "--nproc", "2", "--", "finetune", "--config", str(cfg)],
           "backend: unsloth does not support FSDP", out, entry=launch.main)


def test_fsdp_with_unsloth_refused_by_finetune(setup, capsys, monkeypatch):
    tmp, model, data, out = setup
    monkeypatch.setenv("ACCELERATE_USE_FSDP", "true")  # what accelerate sets in each FSDP rank
    cfg = write_train_config(tmp / "t.yaml", model, data, out, backend="unsloth")
    _check(capsys, ["--config", str(cfg)], "backend: unsloth does not support FSDP", out)


def test_world_size_not_dividing_the_batch(setup, capsys, monkeypatch):
    tmp, model, data, out = setup
    cfg = write_train_config(tmp / "t.yaml", model, data, out,
                             **{"train.batch_size": 6, "train.per_device_batch_size": 2})
    msg = "train.batch_size: 6 is not divisible by world size 2 x train.per_device_batch_size 2 = 4"
    # launch refuses before starting any process ...
    _check(capsys, ["--strategy", "ddp", "--nproc", "2", "--cpu", "--", "finetune", "--config", str(cfg)],
           msg, out, entry=launch.main)
    # ... and a rank started some other way (torchrun) refuses too.
    monkeypatch.setenv("WORLD_SIZE", "2")
    _check(capsys, ["--config", str(cfg)], msg, out)


def test_launch_argument_errors(setup, capsys):
    tmp, model, data, out = setup
    cfg = write_train_config(tmp / "t.yaml", model, data, out)
    _check(capsys, ["--strategy", "ddp", "--", "python", "x.py"], "expected `finetune ...`", out, entry=launch.main)
    _check(capsys, ["--strategy", "ddp", "--nnodes", "2", "--", "finetune", "--config", str(cfg)],
           "--nnodes > 1 needs --master-addr and --master-port", out, entry=launch.main)
    _check(capsys, ["--strategy", "ddp", "--sync", "local-sgd:0", "--", "finetune", "--config", str(cfg)],
           "expected every-step or local-sgd:K", out, entry=launch.main)
    _check(capsys, ["--strategy", "fsdp", "--cpu", "--", "finetune", "--config", str(cfg)],
           "--strategy fsdp needs GPUs", out, entry=launch.main)


def test_console_script_exit_code(setup):
    """The installed `finetune` script itself: exit 2 and one clear line, no traceback."""
    tmp, model, data, out = setup
    cfg = write_train_config(tmp / "t.yaml", model, data, out, **{"train.learning_rat": 1})
    exe = Path(sys.executable).with_name("finetune")
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "toolbox_train.commands.finetune"]
    r = subprocess.run([*cmd, "--config", str(cfg)], capture_output=True, text=True, timeout=120,
                       env={**os.environ, "PYTHONPATH": str(ROOT / "entrypoints")})
    assert r.returncode == 2, r.stderr
    assert r.stderr.strip().endswith("train.learning_rat: unknown key")
    assert not out.exists()


def test_unknown_optimizer_or_scheduler(setup, capsys):
    tmp, model, data, out = setup
    cfg = write_train_config(tmp / "t.yaml", model, data, out, **{"train.optimizer": "adamw_turbo"})
    _check(capsys, ["--config", str(cfg)], "train.optimizer: 'adamw_turbo' is not one of adamw_torch", out)
    cfg = write_train_config(tmp / "t.yaml", model, data, out, **{"train.lr_scheduler": "zigzag"})
    _check(capsys, ["--config", str(cfg)], "train.lr_scheduler: 'zigzag' is not one of linear, cosine", out)


def test_output_dir_that_cannot_be_written_is_refused_before_the_model_loads(setup, capsys, monkeypatch):
    from helpers.mounts import read_only, tmpfs

    from toolbox_train.training import loading as models

    tmp, model, data, out = setup

    def no_load(*a, **kw):
        raise AssertionError("the model was loaded")

    monkeypatch.setattr(models, "load", no_load)
    afile = tmp / "afile"
    afile.write_text("a file\n")
    cfg = write_train_config(tmp / "t.yaml", model, data, afile / "out")
    _check(capsys, ["--config", str(cfg)], f"output.dir: {afile / 'out'}: {afile} is a file, not a folder", afile)
    assert afile.read_text() == "a file\n"
    with tmpfs(tmp / "ro") as ro:
        (ro / "old").mkdir()
        (ro / "old" / "notes.txt").write_text("an earlier run\n")
        read_only(ro)
        cfg = write_train_config(tmp / "t.yaml", model, data, ro / "new" / "out")
        _check(capsys, ["--config", str(cfg)],
               f"output.dir: {ro / 'new' / 'out'}: cannot be made: {ro} is on a read-only file system", ro)
        cfg = write_train_config(tmp / "t.yaml", model, data, ro / "old")
        for flag in ("--overwrite", "--resume"):
            _check(capsys, ["--config", str(cfg), flag], f"output.dir: {ro / 'old'}: {ro / 'old'} is on a read-only "
                   "file system", ro)
        r = subprocess.run([sys.executable, "-m", "toolbox_train.commands.finetune", "--config", str(cfg), "--overwrite"],
                           capture_output=True, text=True, timeout=300,
                           env={**os.environ, "PYTHONPATH": f"{ROOT / 'entrypoints'}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"})
        assert r.returncode == 2 and r.stderr.count("\n") == 1 and "read-only file system" in r.stderr, r.stderr


def test_router_aux_loss_coef_needs_a_router_and_sft(setup, capsys):
    tmp, model, data, out = setup  # tiny_model: a llama, no router
    cfg = write_train_config(tmp / "t.yaml", model, data, out)
    _check(capsys, ["--config", str(cfg), "--set", "train.router_aux_loss_coef=0.01"],
           "train.router_aux_loss_coef: 0.01: only for objective sft on a mixture-of-experts model", out)
    _check(capsys, ["--config", str(cfg), "--set", "train.router_aux_loss_coef=-1"],
           "train.router_aux_loss_coef", out)
    _check(capsys, ["--config", str(cfg), "--set", "train.router_aux_loss_coef=nan"],
           "train.router_aux_loss_coef", out)
