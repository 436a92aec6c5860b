"""Checkpoints: atomic, rotated, and an interrupted run resumed equals an uninterrupted one."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file

from helpers.tiny import train_config, write_dataset
from toolbox_train.runs import checkpoints
from toolbox_train.commands import finetune

STEPS, STOP = 7, 4


def _cfg(tmp_path, model, out, method):
    data = tmp_path / "d.jsonl"
    if not data.exists():
        write_dataset(data, "text", n=40)
    over = {"train.max_steps": STEPS, "train.per_device_batch_size": 3, "output.save_steps": 2,
            "output.keep_checkpoints": 2, "train.lr_scheduler": "cosine", "train.warmup_steps": 2,
            "train.optimizer": "adamw_torch", "train.weight_decay": 0.01, "method": method}
    if method == "lora":
        over.update({"lora.r": 4, "lora.dropout": 0.2})  # dropout: the RNG state must be restored too
    return train_config(model, data, out, **over)


def _cps(out):
    return [p.name for p in checkpoints.listed(out / "checkpoints")]


def _weights(out, method):
    return load_file(str(out / ("adapter_model.safetensors" if method == "lora" else "model.safetensors")))


@pytest.mark.parametrize("method", ["lora", "full"])
def test_stopped_and_resumed_equals_uninterrupted(tmp_path, tiny_model, monkeypatch, method):
    ref = tmp_path / "ref"
    finetune.run(_cfg(tmp_path, tiny_model, ref, method))

    out = tmp_path / "cut"
    monkeypatch.setenv("TOOLBOX_STOP_AFTER_STEP", str(STOP))
    first = finetune.run(_cfg(tmp_path, tiny_model, out, method))
    monkeypatch.delenv("TOOLBOX_STOP_AFTER_STEP")
    assert first["steps"] == STOP
    assert _cps(out) == ["checkpoint-2", "checkpoint-4"]
    # Something the interrupted run logged past the checkpoint is dropped on resume.
    with (out / "metrics.jsonl").open("a") as f:
        f.write(json.dumps({"step": STOP + 1, "loss": 0.0}) + "\n")
    with pytest.raises(finetune.UserError, match="not empty.*--resume"):
        finetune.run(_cfg(tmp_path, tiny_model, out, method))
    second = finetune.run(_cfg(tmp_path, tiny_model, out, method), resume=True)
    assert second["steps"] == STEPS

    a, b = _weights(ref, method), _weights(out, method)
    assert a.keys() == b.keys() and a
    diff = max((a[k] - b[k]).abs().max().item() for k in a)
    assert diff <= 1e-6, diff
    ref_loss = [json.loads(x)["loss"] for x in (ref / "metrics.jsonl").read_text().splitlines()]
    cut = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in cut] == list(range(1, STEPS + 1))
    assert [r["loss"] for r in cut] == pytest.approx(ref_loss, abs=1e-5)
    assert _cps(out) == ["checkpoint-6", "checkpoint-7"]  # keep last 2; the last step is always saved
    assert not list((out / "checkpoints").glob(".partial*"))


def test_incomplete_and_corrupt_checkpoints_are_skipped(tmp_path, tiny_model, monkeypatch, capsys):
    out = tmp_path / "run"
    monkeypatch.setenv("TOOLBOX_STOP_AFTER_STEP", "4")
    finetune.run(_cfg(tmp_path, tiny_model, out, "lora"))
    monkeypatch.delenv("TOOLBOX_STOP_AFTER_STEP")
    cpd = out / "checkpoints"
    # A newer checkpoint whose weights are garbage, and a half-written one under the temp name.
    shutil.copytree(cpd / "checkpoint-4", cpd / "checkpoint-9")
    (cpd / "checkpoint-9" / "adapter_model.safetensors").write_bytes(b"\x00garbage")
    shutil.copytree(cpd / "checkpoint-4", cpd / ".partial" / "checkpoint-6")
    capsys.readouterr()
    p = finetune.resolve(_cfg(tmp_path, tiny_model, out, "lora"), resume=True)
    err = capsys.readouterr().err
    assert p.resume_from == cpd / "checkpoint-4"
    assert "skipping checkpoint" in err and "checkpoint-9" in err and "corrupt" in err
    assert "incomplete" in err and ".partial" in err
    (cpd / "checkpoint-4" / "trainer_state.json").write_text("{not json")
    p = finetune.resolve(_cfg(tmp_path, tiny_model, out, "lora"), resume=True)
    assert p.resume_from == cpd / "checkpoint-2"


def test_a_torchrun_restart_resumes_instead_of_refusing(tmp_path, tiny_model, monkeypatch):
    out = tmp_path / "run"
    monkeypatch.setenv("TOOLBOX_STOP_AFTER_STEP", "4")
    finetune.run(_cfg(tmp_path, tiny_model, out, "full"))
    monkeypatch.delenv("TOOLBOX_STOP_AFTER_STEP")
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")  # what torchrun sets in restarted ranks
    s = finetune.run(_cfg(tmp_path, tiny_model, out, "full"), overwrite=True)
    assert s["steps"] == STEPS
    steps = [json.loads(x)["step"] for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert steps == list(range(1, STEPS + 1))  # continued from step 4, not started over


def test_publish_merges_into_a_copy_another_node_published(tmp_path, tiny_model, monkeypatch):
    out = tmp_path / "run"
    monkeypatch.setenv("TOOLBOX_STOP_AFTER_STEP", "2")
    finetune.run(_cfg(tmp_path, tiny_model, out, "full"))
    cp = out / "checkpoints" / "checkpoint-2"
    other = tmp_path / "node1" / "checkpoint-2"  # node 1's copy: same files plus its own RNG state
    shutil.copytree(cp, other)
    import torch

    torch.save({"cpu": torch.arange(7, dtype=torch.uint8)}, other / "rng_state_1.pth")  # a loadable state
    node1 = (other / "rng_state_1.pth").read_bytes()
    (other / "trainer_state.json").write_text("{}")  # must not replace node 0's
    before = (cp / "trainer_state.json").read_text()
    checkpoints.publish(other, cp)
    assert (cp / "rng_state_1.pth").read_bytes() == node1 and (cp / "trainer_state.json").read_text() == before
    assert not other.exists()
    # A broken checkpoint of the same step is replaced whole.
    shutil.copytree(cp, other)
    (cp / "model.safetensors").write_bytes(b"junk")
    checkpoints.publish(other, cp)
    assert checkpoints.problem(cp) is None
