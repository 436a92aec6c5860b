"""The walk of `finetune`'s config through the training package (issue 39), held as
tests/test_build_walk.py holds `build`'s: one stay per module.

tests/helpers/walk.py follows the arguments (the config's path) and what each call of the walk
returns (the parsed config, the resolved run, the datasets, the model, the trainer) through the
modules of toolbox_train. Before: 25 modules in 60 stays, planning/plan.py six times (a mutable
Plan the trainer, the report and prepare_output each asked again), data/dataset.py, the command
and disk.py five times each. Now the resolvers make one frozen ResolvedRun (planning/run.py) that
every later step reads, and each module is entered once.
"""

from __future__ import annotations

import collections

import pytest

from helpers import pref
from helpers.tiny import write_dataset, write_train_config
from helpers.walk import count_calls, stays, walk
from toolbox_train.commands import finetune

# the data path, in its order: config -> resolved run -> rows -> model -> trainer -> report
ORDER = ("toolbox_train.planning.run", "toolbox_train.config.schema", "toolbox_train.planning.inputs",
         "toolbox_train.planning.memory", "toolbox_train.planning.preflight", "toolbox_train.data.dataset",
         "toolbox_train.training.loading", "toolbox_train.units.registry", "toolbox_train.training.trainer",
         "toolbox_train.commands.finetune_report")


def _walk(tmp_path, model, objective="sft"):
    data = (write_dataset(tmp_path / "d.jsonl", "text", n=16) if objective == "sft"
            else pref.write(tmp_path / "d.jsonl", "preference", n=16))
    cfg = write_train_config(tmp_path / "train.yaml", model, data, tmp_path / "out", objective=objective,
                             method="lora", **{"train.max_steps": 1, "lora.r": 4, "lora.alpha": 8})
    return walk(["--config", str(cfg)], prefix="toolbox_train.", main=finetune.main, entry=("toolbox_train.contract",))


@pytest.mark.parametrize("objective", ["sft", "dpo"])
def test_finetune_visits_each_module_once(tmp_path, tiny_model, objective):
    rc, visits = _walk(tmp_path, tiny_model, objective)
    assert rc == 0
    path = stays(visits)
    again = {m: n for m, n in collections.Counter(path).items() if n > 1}
    assert not again, f"modules the walk enters more than once: {again}\n" + " -> ".join(path)
    assert len(path) <= 30, " -> ".join(path)
    order = [m for m in ORDER if m in path]
    assert order == sorted(order, key=path.index) and len(order) == len(ORDER), path


def test_the_walk_sees_a_module_entered_twice(tmp_path, tiny_model, monkeypatch):
    # A check that cannot fail proves nothing: the trainer built a second time is found.
    from toolbox_train.units import registry

    build = registry.build
    monkeypatch.setattr(registry, "build", lambda *a, **k: (build(*a, **k), build(*a, **k))[1])
    rc, visits = _walk(tmp_path, tiny_model)
    assert rc == 0
    counts = collections.Counter(stays(visits))
    assert counts["toolbox_train.objectives.sft.trainer"] == 2, counts


def test_grpo_picks_its_sampler_once_and_loads_its_rewards_once(tmp_path, tiny_model, monkeypatch):
    # Issue 45: the sampler was picked three times (the memory plan, the TRL config, the trainer) and the
    # reward functions resolved twice (preflight, then finetune again: the user's module run twice). Now
    # the unit's resolve hook picks it once into the run's extras, its prepare hook loads the rewards once.
    import yaml

    from toolbox_train.generation import sampler
    from toolbox_train.planning import rewards

    calls = count_calls(monkeypatch, (sampler, "pick"), (rewards, "resolve"))
    mark = tmp_path / "imported"
    (tmp_path / "myrewards.py").write_text(
        f"open({str(mark)!r}, 'a').write('x')\n\n"
        "def short(completions, **kw):\n    return [-float(len(str(c))) for c in completions]\n")
    data = pref.write(tmp_path / "p.jsonl", "prompt", n=8)
    cfg = write_train_config(tmp_path / "train.yaml", tiny_model, data, tmp_path / "out", objective="grpo",
                             method="lora", **{"train.max_steps": 1, "lora.r": 4, "lora.alpha": 8,
                                               "train.per_device_batch_size": 4, "grpo.num_generations": 2,
                                               "grpo.max_completion_length": 4, "data.max_seq_length": 32,
                                               "grpo.rewards": [{"function": "myrewards:short"}]})
    assert finetune.main(["--config", str(cfg)]) == 0
    assert calls == {"pick": 1, "resolve": 1}, calls
    assert mark.read_text() == "x"  # the user's reward module ran once in this process
    resolved = yaml.safe_load((tmp_path / "out" / "config.resolved.yaml").read_text())["_resolved"]
    assert resolved["sampler"] == "transformers" and "CPU" in resolved["sampler_why"]
