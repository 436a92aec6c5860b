"""GRPO's reward functions as docs/preference.md describes them (issue 32): the data's other columns
reach them as keyword arguments; each is called on a few rows before the model loads (a raise, a wrong
count, a non-number, NaN or None: exit 2 naming the function and its config line, nothing written); a
NaN or missing reward during training stops the run as a NaN loss does. DPO's combined losses train."""

from __future__ import annotations

import json

import pytest
import yaml

from helpers import pref
from helpers.tiny import train_config
from toolbox_train.runs import checkpoints
from toolbox_train.commands import finetune

GRPO = {"objective": "grpo", "method": "full", "train.per_device_batch_size": 4, "grpo.num_generations": 2,
        "grpo.max_completion_length": 4, "data.max_seq_length": 48, "train.max_steps": 2}


def _answers(path, n=8):
    """Prompt rows with an `answer` column: the prompt's last word, so each row's answer is its own."""
    rows = [{"prompt": r["prompt"], "answer": r["prompt"].split()[-1]} for r in pref.rows("prompt", n)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return rows


def _write(tmp_path, model, data, rewards, **over):
    cfg = train_config(model, data, tmp_path / "out", **{**GRPO, "grpo.rewards": rewards, **over})
    path = tmp_path / "train.yaml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return path


def _line_of_reward(cfg, i: int) -> int:
    items = [n for n, ln in enumerate(cfg.read_text().splitlines(), 1) if ln.lstrip().startswith("- function:")]
    return items[i]


def test_an_extra_column_reaches_the_reward_function(tmp_path, tiny_model):
    """The usual pattern: data {"prompt", "answer"} and `def correct(prompts, completions, answer, **kw)`;
    each completion's reward is called with its own prompt's answer, before the model and in training."""
    rows = _answers(tmp_path / "g.jsonl")
    seen = tmp_path / "seen.jsonl"
    (tmp_path / "my_rewards.py").write_text(
        "import json\n"
        "def correct(prompts, completions, answer, **kw):\n"
        f"    with open({str(seen)!r}, 'a') as f:\n"
        "        for p, a in zip(prompts, answer):\n"
        "            f.write(json.dumps({'prompt': p, 'answer': a, 'step': kw['trainer_state'].global_step}) + '\\n')\n"
        "    return [float(a in c) for c, a in zip(completions, answer)]\n")
    cfg = _write(tmp_path, tiny_model, tmp_path / "g.jsonl", [{"function": "my_rewards:correct"}])
    assert finetune.main(["--config", str(cfg)]) == 0
    calls = [json.loads(ln) for ln in seen.read_text().splitlines()]
    want = {r["prompt"]: r["answer"] for r in rows}
    assert calls and all(want[c["prompt"]] == c["answer"] for c in calls)
    # the trial call (4 rows, each its own text as completion: reward 1) and 2 steps x 4 completions
    assert len(calls) == 4 + 2 * 4
    assert [json.loads(ln)["step"] for ln in (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()] == [1, 2]


def test_a_column_named_like_trls_own_arguments_is_refused(tmp_path, tiny_model, capsys):
    rows = [{"prompt": r["prompt"], "completions": "x"} for r in pref.rows("prompt", 4)]
    data = tmp_path / "g.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = _write(tmp_path, tiny_model, data, [{"function": "length", "max_chars": 9}])
    assert finetune.main(["--config", str(cfg)]) == 2
    err = capsys.readouterr().err
    assert f"data: {data}: column(s) ['completions'] have the names of arguments TRL gives" in err, err
    assert not (tmp_path / "out").exists()


BAD = {
    "raises": ("def bad(prompts, completions, answer, **kw):\n    raise KeyError('no score')\n",
               "raised KeyError: 'no score'"),
    "missing_column": ("def bad(prompts, completions, solution, **kw):\n    return [0.0] * len(completions)\n",
                       "raised TypeError: bad() missing 1 required positional argument: 'solution'"),
    "wrong_count": ("def bad(completions, **kw):\n    return [1.0]\n", "returned 1 rewards for 4 completions"),
    "not_a_list": ("def bad(completions, **kw):\n    return 1.0\n", "returned float, not a list of numbers"),
    "non_number": ("def bad(completions, **kw):\n    return ['1'] * len(completions)\n",
                   "returned str '1' for completion 1, not a number"),
    "nan": ("def bad(completions, **kw):\n    return [0.0, float('nan')] * (len(completions) // 2)\n",
            "returned nan for completion 2"),
    "none": ("def bad(completions, **kw):\n    return [None] * len(completions)\n",
             "returned None for completion 1 (a missing reward"),
    "not_callable": ("bad = 3\n", "my_rewards:bad: my_rewards.bad is a int, not callable"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_a_reward_function_that_fails_on_real_rows_is_refused_before_the_model(tmp_path, tiny_model, capsys, case):
    code, expect = BAD[case]
    _answers(tmp_path / "g.jsonl")
    (tmp_path / "my_rewards.py").write_text(code)
    cfg = _write(tmp_path, tiny_model, tmp_path / "g.jsonl",
                 [{"function": "length", "max_chars": 9}, {"function": "my_rewards:bad"}])
    assert finetune.main(["--config", str(cfg)]) == 2
    raw = capsys.readouterr().err
    err = [ln for ln in raw.splitlines() if "error" in ln]
    assert len(err) == 1 and "Traceback" not in raw, raw
    assert err[0].startswith(f"finetune: error: {cfg}:{_line_of_reward(cfg, 1)}: grpo.rewards.1.function: "
                             "my_rewards:bad"), err
    assert expect in err[0], err
    if case != "not_callable":
        assert "on 4 rows of data.path, each prompt's own text standing in for its completion" in err[0]
    assert not (tmp_path / "out").exists()


def test_eval_rows_are_tried_too_and_launch_refuses_before_any_rank(tmp_path, tiny_model, capsys):
    """data.eval_path's rows may lack a column the training rows have: named before the model loads;
    launch runs the same trial before it starts a rank."""
    from toolbox_train.commands import launch

    _answers(tmp_path / "g.jsonl")
    evald = pref.write(tmp_path / "e.jsonl", "prompt", 4)  # no answer column
    (tmp_path / "my_rewards.py").write_text(
        "def correct(prompts, completions, answer, **kw):\n    return [float(a in c) for c, a in zip(completions, answer)]\n")
    cfg = _write(tmp_path, tiny_model, tmp_path / "g.jsonl", [{"function": "my_rewards:correct"}],
                 **{"data.eval_path": str(evald)})
    for run in (lambda: finetune.main(["--config", str(cfg)]),
                lambda: launch.main(["--strategy", "ddp", "--nproc", "2", "--cpu", "--", "finetune", "--config", str(cfg)])):
        assert run() == 2
        err = capsys.readouterr().err
        assert f"{cfg}:{_line_of_reward(cfg, 0)}: grpo.rewards.0.function: my_rewards:correct: raised TypeError: " \
               "correct() missing 1 required positional argument: 'answer' (called before the model loads on 4 rows " \
               "of data.eval_path" in err, err
        assert "Traceback" not in err and not (tmp_path / "out").exists()


@pytest.mark.parametrize("value", ["float('nan')", "None"])
def test_a_nan_or_missing_reward_in_training_stops_the_run(tmp_path, tiny_model, capsys, value):
    """Fine on the trial call (trainer_state.global_step 0), NaN/None from step 3 on: the run stops there
    as a NaN loss does, naming the function; the checkpoint of step 2 is kept, nothing after it."""
    _answers(tmp_path / "g.jsonl")
    (tmp_path / "my_rewards.py").write_text(
        "def late(completions, trainer_state, **kw):\n"
        f"    return [{value} if trainer_state.global_step >= 2 else 1.0 for c in completions]\n")
    out = tmp_path / "out"
    cfg = _write(tmp_path, tiny_model, tmp_path / "g.jsonl",
                 [{"function": "length", "max_chars": 9}, {"function": "my_rewards:late"}],
                 **{"train.max_steps": 4, "output.save_steps": 2})
    assert finetune.main(["--config", str(cfg)]) == 1
    err = capsys.readouterr().err
    last = err.strip().splitlines()[-1]
    assert "Traceback" not in err, err
    assert last.startswith("finetune: error: a reward function returned NaN/inf or None at step 3 "
                           "(grpo.rewards.1.function my_rewards:late: 4 of 4 completions)"), err
    assert str(out / "checkpoints" / "checkpoint-2") in last and "--resume" in last
    assert [p.name for p in checkpoints.listed(out / "checkpoints")] == ["checkpoint-2"]
    assert not (out / "summary.json").exists() and not (out / "model.safetensors").exists()


def test_a_reward_function_raising_in_training_is_named(tmp_path, tiny_model, capsys):
    """It was 'internal error: KeyError' (TRL's exception, the function not named)."""
    _answers(tmp_path / "g.jsonl")
    (tmp_path / "my_rewards.py").write_text(
        "def late(completions, trainer_state, **kw):\n"
        "    if trainer_state.global_step >= 1:\n        raise KeyError('no such answer')\n"
        "    return [1.0 for c in completions]\n")
    cfg = _write(tmp_path, tiny_model, tmp_path / "g.jsonl", [{"function": "my_rewards:late"}])
    assert finetune.main(["--config", str(cfg)]) == 1
    err = capsys.readouterr().err
    last = err.strip().splitlines()[-1]
    assert "Traceback" not in err and "internal error" not in err, err
    assert last.startswith("finetune: error: grpo.rewards.0.function my_rewards:late raised KeyError: 'no such answer' "
                           "at step 2: training stopped, nothing written after it"), err
    assert not (tmp_path / "out" / "summary.json").exists()
    # step 1 trained with the reward the function gave before it raised
    assert json.loads((tmp_path / "out" / "metrics.jsonl").read_text().splitlines()[0])["reward"] == 1.0


def test_dpo_with_combined_losses_and_their_weights_trains(tmp_path, tiny_model, capsys):
    """docs/preference.md's example: loss_type [sigmoid, sft] with loss_weights [1.0, 0.5]."""
    data = pref.write(tmp_path / "p.jsonl", "preference", 16)
    cfg = train_config(tiny_model, data, tmp_path / "out", **{
        "objective": "dpo", "method": "lora", "train.max_steps": 2, "data.max_seq_length": 48,
        "dpo.loss_type": ["sigmoid", "sft"], "dpo.loss_weights": [1.0, 0.5]})
    s = finetune.run(cfg)
    assert s["steps"] == 2
    assert "loss_type sigmoid+sft, loss_weights 1.0+0.5" in capsys.readouterr().err
    resolved = yaml.safe_load((tmp_path / "out" / "config.resolved.yaml").read_text())
    assert resolved["dpo"]["loss_weights"] == [1.0, 0.5]


def test_the_trial_call_passes_what_trl_passes(tiny_model):
    """The trial's arguments are TRL's (_calculate_rewards): prompts, completions (conversational ones as
    assistant messages holding the prompt's last text), completion_ids, the other columns, trainer_state,
    log_extra, log_metric; an async function is awaited."""
    from datasets import Dataset
    from transformers import AutoTokenizer

    from toolbox_train.config.schema import TrainConfig
    from toolbox_train.planning import rewards

    got = {}

    def record(prompts, completions, completion_ids, answer, trainer_state, log_extra, log_metric):
        got.update(prompts=prompts, completions=completions, ids=completion_ids, answer=answer,
                   step=trainer_state.global_step)
        return [0.5] * len(completions)

    async def later(completions, **kw):
        return [1] * len(completions)

    chat = [[{"role": "user", "content": f"say {w}"}] for w in ("a", "b", "c", "d", "e")]
    ds = Dataset.from_list([{"prompt": p, "answer": str(i)} for i, p in enumerate(chat)])
    cfg = TrainConfig.model_validate({"model": {"path": "m"}, "data": {"path": "d"}, "output": {"dir": "o"},
                                      "objective": "grpo", "grpo": {"rewards": [{"function": "m:record"},
                                                                                {"function": "m:later"}]}})
    tok = AutoTokenizer.from_pretrained(tiny_model)
    rewards.trial(cfg.grpo.rewards, [record, later], ds, tok, "data.path", "grpo.rewards")
    assert got["prompts"] == chat[:4] and got["answer"] == ["0", "1", "2", "3"] and got["step"] == 0
    assert got["completions"] == [[{"role": "assistant", "content": f"say {w}"}] for w in "abcd"]
    assert got["ids"] == [tok(f"say {w}", add_special_tokens=False)["input_ids"] for w in "abcd"]

    async def nan(completions, **kw):
        return [float("nan")] * len(completions)

    with pytest.raises(rewards.UserError, match=r"grpo.rewards.1.function: m:later: returned nan for completion 1"):
        rewards.trial(cfg.grpo.rewards, [record, nan], ds, tok, "data.path", "grpo.rewards")
