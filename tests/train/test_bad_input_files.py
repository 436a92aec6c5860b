"""Bad data, bad model files, bad checkpoints (issue 13): each is refused before anything is
written, naming the file (and line), or skipped with a warning that names the file."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from helpers.tiny import train_config, write_dataset, write_train_config
from toolbox_train.runs import checkpoints
from toolbox_train.commands import finetune

NO_OUTPUT = "nothing may be written"


@pytest.fixture
def setup(tmp_path, tiny_model):
    data = write_dataset(tmp_path / "d.jsonl", "text", n=16)
    return tmp_path, tiny_model, data, tmp_path / "out"


def _refused(capsys, cfg: Path, expect: list[str], out: Path, *extra: str) -> str:
    before = sorted(p.name for p in out.iterdir()) if out.exists() else None
    assert finetune.main(["--config", str(cfg), *extra]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err, err
    for e in expect:
        assert e in err, err
    assert (sorted(p.name for p in out.iterdir()) if out.exists() else None) == before, NO_OUTPUT
    return err


def _jsonl(path: Path, rows: list) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def test_text_rows_missing_their_field_are_named_by_line(setup, capsys):
    tmp, model, data, out = setup
    rows = [{"text": f"the cat sees {i}."} for i in range(12)]
    rows[3] = {"txt": "typo"}
    rows[8] = {"text": None}
    rows[10] = {"text": 7}
    bad = _jsonl(tmp / "bad.jsonl", rows)
    cfg = write_train_config(tmp / "t.yaml", model, bad, out)
    err = _refused(capsys, cfg, [f"{bad}:4: no 'text' field (text format)", f"{bad}:9", f"{bad}:11",
                                 "(3 of 12 rows bad)"], out)
    assert err.count("\n") == 1  # one line


def test_alpaca_and_messages_rows_are_checked_against_the_format(setup, capsys):
    tmp, model, data, out = setup
    rows = [{"instruction": "Repeat.", "input": "a", "output": "a"}] * 5 + [{"instruction": "Repeat.", "input": "b"}]
    bad = _jsonl(tmp / "alpaca.jsonl", rows)
    _refused(capsys, write_train_config(tmp / "t.yaml", model, bad, out),
             [f"{bad}:6: no 'output' field (alpaca format)"], out)
    rows = [{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}] * 3
    rows.append({"messages": [{"role": "user"}]})
    bad = _jsonl(tmp / "chat.jsonl", ["", *[json.dumps(r) for r in rows]])  # a blank first line counts too
    _refused(capsys, write_train_config(tmp / "t.yaml", model, bad, out),
             [f"{bad}:5: messages[0] must be"], out)


def test_empty_and_blank_only_jsonl(setup, capsys):
    tmp, model, data, out = setup
    empty = tmp / "empty.jsonl"
    empty.write_text("")
    _refused(capsys, write_train_config(tmp / "t.yaml", model, empty, out), [f"{empty}: the file is empty"], out)
    blank = tmp / "blank.jsonl"
    blank.write_text("\n  \n\n")
    _refused(capsys, write_train_config(tmp / "t.yaml", model, blank, out), [f"{blank}: only blank lines"], out)


def test_binary_and_non_yaml_configs(setup, capsys):
    tmp, model, data, out = setup
    binary = tmp / "train.yaml"
    binary.write_bytes(Path("/bin/true").read_bytes()[:4096])
    _refused(capsys, binary, [str(binary)], out)
    nested = tmp / "deep.yaml"
    nested.write_text("[" * 900)
    _refused(capsys, nested, [str(nested)], out)
    tagged = write_train_config(tmp / "tag.yaml", model, data, out)
    tagged.write_text(tagged.read_text() + "extra: !foo bar\n")
    _refused(capsys, tagged, [str(tagged)], out)


def test_a_role_the_chat_template_rejects_names_its_row(setup, capsys):
    tmp, model, data, out = setup
    strict = tmp / "strict-model"
    shutil.copytree(model, strict)
    (strict / "chat_template.jinja").write_text(
        "{% for m in messages %}{% if m['role'] not in ['user', 'assistant', 'system'] %}"
        "{{ raise_exception('unknown role ' + m['role']) }}{% endif %}"
        "<|{{ m['role'] }}|>{% generation %}{{ m['content'] }}<|end|>{% endgeneration %}\n{% endfor %}")
    good = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}
    rows = [good] * 6 + [{"messages": [{"role": "robot", "content": "beep"}]}] + [good]
    chat = _jsonl(tmp / "chat.jsonl", rows)
    cfg = write_train_config(tmp / "t.yaml", strict, chat, out)
    _refused(capsys, cfg, [f"{chat}:7: the model's chat template rejects this conversation: unknown role robot"], out)


def test_alpaca_prompts_longer_than_max_seq_length_are_refused_before_loading(setup, capsys):
    tmp, model, data, out = setup
    long = write_dataset(tmp / "alpaca.jsonl", "alpaca", n=8)
    cfg = write_train_config(tmp / "t.yaml", model, long, out, **{"data.max_seq_length": 8})
    _refused(capsys, cfg, ["data.path: 8 of 8 rows lose their whole completion", f"{long}:1",
                           "raise data.max_seq_length"], out)


def test_truncated_model_weights_are_named(setup, capsys):
    tmp, model, data, out = setup
    broken = tmp / "broken-model"
    shutil.copytree(model, broken)
    w = broken / "model.safetensors"
    w.write_bytes(w.read_bytes()[: w.stat().st_size // 2])
    cfg = write_train_config(tmp / "t.yaml", broken, data, out)
    _refused(capsys, cfg, [f"model.path: {w}: truncated or corrupt"], out)


def test_a_folder_left_before_step_1_is_rerun_without_overwrite(setup, capsys):
    tmp, model, data, out = setup
    cfg = write_train_config(tmp / "t.yaml", model, data, out)
    # What a run that died loading the model or in its first step leaves (and launch's folder).
    (out / "checkpoints" / ".partial-node0").mkdir(parents=True)
    (out / "tensorboard").mkdir()
    (out / "launch").mkdir()
    (out / "launch" / "settings.node0.json").write_text("{}")
    (out / "config.resolved.yaml").write_text("model: {}\n")
    assert finetune.main(["--config", str(cfg)]) == 0
    assert not (out / "tensorboard").exists() and (out / "launch" / "settings.node0.json").exists()
    assert json.loads((out / "metrics.jsonl").read_text().splitlines()[0])["step"] == 1
    # One step further is a run: refused without --resume/--overwrite.
    shutil.rmtree(out / "checkpoints")
    _refused(capsys, cfg, [f"output.dir: {out}: not empty"], out)


def test_resume_skips_a_checkpoint_with_any_truncated_file(tmp_path, tiny_model, monkeypatch, capsys):
    data = write_dataset(tmp_path / "d.jsonl", "text", n=40)
    out = tmp_path / "run"
    cfg = train_config(tiny_model, data, out, **{"train.max_steps": 8, "output.save_steps": 2,
                                                 "output.keep_checkpoints": 3, "method": "lora", "lora.r": 4})
    monkeypatch.setenv("TOOLBOX_STOP_AFTER_STEP", "4")
    finetune.run(cfg)
    monkeypatch.delenv("TOOLBOX_STOP_AFTER_STEP")
    cpd = out / "checkpoints"
    assert [p.name for p in checkpoints.listed(cpd)] == ["checkpoint-2", "checkpoint-4"]
    for name in ("optimizer.pt", "scheduler.pt", "rng_state.pth", "adapter_model.safetensors", "trainer_state.json"):
        f = cpd / "checkpoint-4" / name
        whole = f.read_bytes()
        f.write_bytes(whole[: len(whole) // 2])
        capsys.readouterr()
        p = finetune.resolve(cfg, resume=True)
        err = capsys.readouterr().err
        assert p.resume_from == cpd / "checkpoint-2", name
        assert f"skipping checkpoint {cpd / 'checkpoint-4'}: {name}" in err or \
            (name == "trainer_state.json" and "trainer_state.json is corrupt" in err), err
        f.write_bytes(whole)
    # The whole resume from the previous checkpoint, with a broken newest one, trains to the end.
    f = cpd / "checkpoint-4" / "optimizer.pt"
    f.write_bytes(f.read_bytes()[:100])
    s = finetune.run(cfg, resume=True)
    assert s["steps"] == 8
    steps = [json.loads(x)["step"] for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert steps == list(range(1, 9))


def test_launch_refuses_bad_data_before_any_rank_or_file(setup, capsys):
    from toolbox_train.commands import launch

    tmp, model, data, out = setup
    bad = _jsonl(tmp / "bad.jsonl", [{"text": "fine"}, {"txt": "typo"}])
    cfg = write_train_config(tmp / "t.yaml", model, bad, out)
    assert launch.main(["--strategy", "ddp", "--nproc", "2", "--cpu", "--", "finetune", "--config", str(cfg)]) == 2
    err = capsys.readouterr().err
    assert f"{bad}:2: no 'text' field" in err and "Traceback" not in err, err
    assert not out.exists()  # not even launch/ (the accelerate config is written after every check)


@pytest.mark.parametrize("name, content", [("state.json", b'{"_data_files": [{"filename"'),
                                           ("dataset_info.json", b"\xff\xfe not json"),
                                           ("state.json", b"[1, 2]"),
                                           ("train/state.json", b"{oops"),  # a DatasetDict's split
                                           ("data-00000-of-00001.arrow", b"ARROW1\x00\x00")])
def test_a_saved_dataset_with_a_corrupt_file_is_named(setup, capsys, name, content):
    import datasets

    tmp, model, data, out = setup
    ds = datasets.Dataset.from_list([{"text": f"the cat sees {i}."} for i in range(8)])
    saved = tmp / "saved"
    if name.startswith("train/"):
        datasets.DatasetDict({"train": ds}).save_to_disk(str(saved))
    else:
        ds.save_to_disk(str(saved))
    (saved / name).write_bytes(content)
    cfg = write_train_config(tmp / "t.yaml", model, saved, out)
    capsys.readouterr()  # save_to_disk's progress bar
    err = _refused(capsys, cfg, [f"data.path: {saved}: not a readable saved dataset"], out)
    assert err.count("\n") == 1 and (name.endswith(".arrow") or str(saved / name) in err), err
    assert not out.exists()
