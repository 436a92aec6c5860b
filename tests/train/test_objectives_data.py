"""Preference data and objective settings refused before any model loads (issue 24): each bad
row named by file and line, one line on stderr, exit 2, nothing written."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from helpers import pref
from helpers.tiny import write_train_config
from toolbox_train.commands import finetune
from toolbox_train.data import pref_rows

NO_OUTPUT = "nothing may be written"


def _jsonl(path: Path, rows: list) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _refused(capsys, tmp_path, model, data, expect: list[str], **over) -> str:
    out = tmp_path / "out"
    cfg = write_train_config(tmp_path / "t.yaml", model, data, out, **over)
    assert finetune.main(["--config", str(cfg)]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err, err
    assert len([ln for ln in err.splitlines() if "error" in ln]) == 1, err
    for e in expect:
        assert e in err, err
    assert not out.exists(), NO_OUTPUT
    return err


def test_preference_rows_missing_equal_or_empty_are_named(tmp_path, tiny_model, capsys):
    rows = pref.rows("preference", 12)
    del rows[2]["rejected"]  # line 3
    rows[5]["rejected"] = rows[5]["chosen"]  # line 6
    rows[8]["chosen"] = "   "  # line 9
    bad = _jsonl(tmp_path / "p.jsonl", rows)
    _refused(capsys, tmp_path, tiny_model, bad,
             [f"data.path: {bad}:3: no 'rejected' field (preference format: prompt (optional), chosen, rejected)",
              f"{bad}:6", f"{bad}:9", "2 more bad row(s)", "(3 of 12 rows bad)"], objective="dpo")
    _jsonl(bad, [rows[5]])
    _refused(capsys, tmp_path, tiny_model, bad, [f"{bad}:1: 'chosen' equals 'rejected' (nothing to prefer)"],
             objective="orpo")
    _jsonl(bad, [rows[8]])
    _refused(capsys, tmp_path, tiny_model, bad, [f"{bad}:1: 'chosen' is empty"], objective="dpo")


def test_an_implicit_prompt_that_swallows_a_completion_is_refused(tmp_path, tiny_model, capsys):
    rows = pref.rows("implicit", 4)
    rows[1] = {"chosen": "the cat sees the moon.", "rejected": "the cat sees the moon. It is big."}
    bad = _jsonl(tmp_path / "i.jsonl", rows)
    _refused(capsys, tmp_path, tiny_model, bad,
             [f"{bad}:2: 'chosen' is empty once the implicit prompt (the start shared with rejected) is taken out"],
             objective="dpo")


def test_unpaired_rows_need_a_boolean_label_and_a_completion(tmp_path, tiny_model, capsys):
    rows = pref.rows("unpaired", 4)
    rows[1]["label"] = "yes"
    rows[3]["completion"] = ""
    bad = _jsonl(tmp_path / "u.jsonl", rows)
    _refused(capsys, tmp_path, tiny_model, bad, [f"{bad}:2: 'label' must be true or false", f"{bad}:4"],
             objective="kto")
    # paired rows given to KTO: named as what they lack
    paired = pref.write(tmp_path / "paired.jsonl", "preference", 4)
    _refused(capsys, tmp_path, tiny_model, paired, [f"{paired}:1: no 'completion' field (unpaired format"],
             objective="kto")


def test_conversational_rows_must_not_mix_strings_and_messages(tmp_path, tiny_model, capsys):
    rows = pref.rows("preference", 3, chat=True)
    rows[2]["rejected"] = "a string"
    bad = _jsonl(tmp_path / "c.jsonl", rows)
    _refused(capsys, tmp_path, tiny_model, bad, [f"{bad}:3: 'prompt', 'chosen' and 'rejected' must all be"],
             objective="dpo")


def test_sft_data_for_dpo_and_a_contradicting_format(tmp_path, tiny_model, capsys):
    text = _jsonl(tmp_path / "t.jsonl", [{"text": "the cat sees the moon."}] * 3)
    _refused(capsys, tmp_path, tiny_model, text, [f"{text}:1: no 'chosen' field"], objective="dpo")
    good = pref.write(tmp_path / "p.jsonl", "preference", 4)
    _refused(capsys, tmp_path, tiny_model, good, ["data.format: objective dpo trains on preference rows"],
             objective="dpo", **{"data.format": "alpaca"})
    _refused(capsys, tmp_path, tiny_model, good, ["data.format: preference is data for dpo/orpo/reward, not objective sft"],
             **{"data.format": "preference"})


def test_grpo_rewards_are_resolved_before_the_model(tmp_path, tiny_model, capsys):
    prompts = pref.write(tmp_path / "g.jsonl", "prompt", 8)
    grpo = {"objective": "grpo", "grpo.num_generations": 4, "train.per_device_batch_size": 4}
    _refused(capsys, tmp_path, tiny_model, prompts, ["grpo.rewards: the objective needs at least one reward"],
             **grpo)
    _refused(capsys, tmp_path, tiny_model, prompts,
             ["grpo.rewards.0.function: no my_rewards.py beside the config", "no installed module 'my_rewards'"],
             **grpo, **{"grpo.rewards": [{"function": "my_rewards:score"}]})
    (tmp_path / "my_rewards.py").write_text("def other(completions, **kw):\n    return [0.0] * len(completions)\n")
    _refused(capsys, tmp_path, tiny_model, prompts,
             ["grpo.rewards.0.function: my_rewards:score: module 'my_rewards' has no function 'score'"],
             **grpo, **{"grpo.rewards": [{"function": "my_rewards:score"}]})
    _refused(capsys, tmp_path, tiny_model, prompts, ["grpo.rewards.0", "not a regular expression"],
             **grpo, **{"grpo.rewards": [{"function": "format", "pattern": "(unclosed"}]})
    _refused(capsys, tmp_path, tiny_model, prompts,
             ["grpo.num_generations: 3 completions per prompt must divide the global batch of completions (4"],
             **{**grpo, "grpo.num_generations": 3, "grpo.rewards": [{"function": "length", "max_chars": 9}]})


@pytest.mark.parametrize("kind,fmt", [("preference", "preference"), ("implicit", "preference"),
                                      ("unpaired", "unpaired"), ("prompt", "prompt")])
@pytest.mark.parametrize("chat", [False, True])
def test_the_toy_sets_pass_in_both_forms(kind, fmt, chat):
    assert [pref_rows.problem(r, fmt) for r in pref.rows(kind, 6, chat=chat)] == [None] * (6 * (2 if kind == "unpaired" else 1))


def test_an_older_trl_is_refused_for_the_preference_objectives(tmp_path, tiny_model, capsys, monkeypatch):
    """An older TRL (gfx1151 images built before issue 24 carry 0.24) is refused before loading."""
    import importlib.metadata

    real = importlib.metadata.version
    monkeypatch.setattr(importlib.metadata, "version", lambda d: "0.24.0" if d == "trl" else real(d))
    good = pref.write(tmp_path / "p.jsonl", "preference", 4)
    _refused(capsys, tmp_path, tiny_model, good, ["objective: dpo needs TRL >= 1.15.0 (installed: 0.24.0)",
                                                  "every shipped stack pins TRL 1.15.0"],
             objective="dpo")


def test_liger_is_for_sft_only(tmp_path, tiny_model, capsys):
    good = pref.write(tmp_path / "p.jsonl", "preference", 4)
    _refused(capsys, tmp_path, tiny_model, good, ["train.liger: only with objective sft"],
             objective="dpo", **{"train.liger": True})


def test_launch_refuses_bad_preference_data_and_rewards_before_any_rank(tmp_path, tiny_model, capsys):
    from toolbox_train.commands import launch

    out = tmp_path / "out"
    rows = pref.rows("preference", 4)
    rows[3]["chosen"] = rows[3]["rejected"]
    bad = _jsonl(tmp_path / "p.jsonl", rows)
    for data, over, expect in (
            (bad, {"objective": "dpo"}, f"{bad}:4: 'chosen' equals 'rejected'"),
            (pref.write(tmp_path / "g.jsonl", "prompt", 8),
             {"objective": "grpo", "grpo.num_generations": 2, "grpo.rewards": [{"function": "nowhere:score"}]},
             "grpo.rewards.0.function: no nowhere.py beside the config")):
        cfg = write_train_config(tmp_path / "t.yaml", tiny_model, data, out, **over)
        assert launch.main(["--strategy", "ddp", "--nproc", "2", "--cpu", "--", "finetune", "--config",
                            str(cfg)]) == 2
        err = capsys.readouterr().err
        assert expect in err and "Traceback" not in err, err
        assert not out.exists()


def test_a_role_the_chat_template_rejects_in_a_preference_row_is_named(tmp_path, tiny_model, capsys):
    import shutil

    strict = tmp_path / "strict-model"
    shutil.copytree(tiny_model, strict)
    (strict / "chat_template.jinja").write_text(
        "{% for m in messages %}{% if m['role'] not in ['user', 'assistant'] %}"
        "{{ raise_exception('unknown role ' + m['role']) }}{% endif %}"
        "<|{{ m['role'] }}|>{{ m['content'] }}<|end|>\n{% endfor %}")
    rows = pref.rows("preference", 5, chat=True)
    rows[3]["rejected"] = [{"role": "robot", "content": "beep"}]
    bad = _jsonl(tmp_path / "c.jsonl", rows)
    _refused(capsys, tmp_path, strict, bad,
             [f"{bad}:4: the model's chat template rejects this conversation: unknown role robot"], objective="dpo")
    prompts = _jsonl(tmp_path / "g.jsonl", [{"prompt": [{"role": "system", "content": "be brief"}]}] * 2)
    _refused(capsys, tmp_path, strict, prompts, [f"{prompts}:1: the model's chat template rejects", "(2 of 2"],
             objective="grpo", **{"grpo.num_generations": 2, "grpo.rewards": [{"function": "length", "max_chars": 9}]})


def test_backend_auto_takes_the_faster_measured_path_for_dpo(monkeypatch):
    """Issue 24's H200 figures: DPOTrainer + PEFT 13.1 pairs/s, under Unsloth 8.9: auto -> hf for DPO;
    the others keep SFT's rule (Unsloth where it imports, on a GPU; GRPO's measured so on an H100, 2026-12-06)."""
    import importlib.machinery
    import sys
    import types

    from toolbox_train.planning.run import pick_backend
    from toolbox_train.config.schema import TrainConfig

    fake = types.ModuleType("unsloth")
    fake.__spec__ = importlib.machinery.ModuleSpec("unsloth", None)
    monkeypatch.setitem(sys.modules, "unsloth", fake)
    base = {"model": {"path": "m"}, "data": {"path": "d"}, "output": {"dir": "o"}}
    picked = {o: pick_backend(TrainConfig.model_validate({**base, "objective": o}), gpu=True, fsdp=False)
              for o in ("sft", "dpo", "orpo", "kto", "grpo")}
    assert picked == {"sft": "unsloth", "dpo": "hf", "orpo": "unsloth", "kto": "unsloth", "grpo": "unsloth"}
