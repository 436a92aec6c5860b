"""A user's reward module (module.py beside the config) is executed once per process (issue 46):
preflight's resolve and the run's find the same module; a changed file is executed again, one that
fails to import is not kept."""

from __future__ import annotations

import json

import yaml

from helpers import pref
from helpers.tiny import train_config
from toolbox_train.commands import finetune

REWARDS = ("import os\n"
           "with open(os.path.join(os.path.dirname(__file__), 'executions.txt'), 'a') as f:\n"
           "    f.write('executed\\n')\n"
           "def correct(prompts, completions, answer, **kw):\n"
           "    return [float(a in c) for c, a in zip(completions, answer)]\n")


def _config(rewards: list[dict]):
    from toolbox_train.config.schema import TrainConfig

    return TrainConfig.model_validate({"model": {"path": "m"}, "data": {"path": "d"}, "output": {"dir": "o"},
                                       "objective": "grpo", "grpo": {"rewards": rewards}})


def test_resolve_twice_executes_the_module_once_and_a_changed_file_again(tmp_path):
    from toolbox_train.planning import rewards

    module = tmp_path / "my_rewards.py"
    module.write_text(REWARDS)
    cfg = _config([{"function": "my_rewards:correct"}])
    first, _ = rewards.resolve(cfg.grpo.rewards, tmp_path, "grpo.rewards")
    second, _ = rewards.resolve(cfg.grpo.rewards, tmp_path, "grpo.rewards")
    assert first[0] is second[0]
    assert (tmp_path / "executions.txt").read_text().split() == ["executed"]
    module.write_text(REWARDS + "# changed\n")
    third, _ = rewards.resolve(cfg.grpo.rewards, tmp_path, "grpo.rewards")
    assert third[0] is not first[0]
    assert (tmp_path / "executions.txt").read_text().split() == ["executed", "executed"]


def test_a_module_that_fails_to_import_fails_each_time(tmp_path):
    import pytest

    from toolbox_train.planning import rewards

    (tmp_path / "broken_rewards.py").write_text("raise RuntimeError('no')\ndef f(**kw):\n    return []\n")
    cfg = _config([{"function": "broken_rewards:f"}])
    for _ in range(2):
        with pytest.raises(rewards.UserError, match="broken_rewards.py: importing it failed: no"):
            rewards.resolve(cfg.grpo.rewards, tmp_path, "grpo.rewards")


def test_finetune_executes_the_reward_module_once(tmp_path, tiny_model):
    rows = [{"prompt": r["prompt"], "answer": r["prompt"].split()[-1]} for r in pref.rows("prompt", 8)]
    (tmp_path / "g.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "my_rewards.py").write_text(REWARDS)
    cfg = train_config(tiny_model, tmp_path / "g.jsonl", tmp_path / "out", **{
        "objective": "grpo", "method": "full", "train.per_device_batch_size": 4, "grpo.num_generations": 2,
        "grpo.max_completion_length": 4, "data.max_seq_length": 48, "train.max_steps": 1,
        "grpo.rewards": [{"function": "my_rewards:correct"}]})
    path = tmp_path / "train.yaml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    assert finetune.main(["--config", str(path)]) == 0
    # preflight resolved and tried it; the run trains with what preflight resolved: one execution (it was two)
    assert (tmp_path / "executions.txt").read_text().split() == ["executed"]
