"""GRPO for agents (issue 46): `grpo.tools` and `grpo.environment` through TRL 1.15's GRPOTrainer
(`tools`, `environment_factory`, `max_tool_calling_iterations`). The model's first turns are scripted
(TRL's `_generate_single_turn` returns the chat template's tool-call text for them: a random 2-layer
model would never write one); everything else is real: TRL parses the call, the user's tool or the
environment's method runs, its result goes back into the conversation, the tiny model generates the
next turn, the reward functions score the whole conversation and the step trains. Bad tool modules and
a template without tool support are refused before the model loads: one line naming the field, exit
2, nothing written. A run with beta > 0 keeps TRL's kl in summary.json."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from helpers.tiny import make_tiny_model, train_config
from test_objectives_data import _refused
from toolbox_train.commands import finetune

PROMPTS = ["What is 2 plus 3?", "Add 2 and 3.", "2 + 3 = ?", "Sum of 2 and 3?"]


def _call(name: str, **args) -> str:
    return f'<tool_call>\n{json.dumps({"name": name, "arguments": args})}\n</tool_call><|im_end|>'


@pytest.fixture(scope="module")
def tool_model(tmp_path_factory) -> Path:
    """A tiny Qwen3 whose tokenizer carries TRL's copy of Qwen3's chat template (tool calls in
    <tool_call> tags, results in <tool_response>; TRL knows how to parse it)."""
    import trl
    from transformers import AutoTokenizer

    d = make_tiny_model(tmp_path_factory.mktemp("tool-qwen3"), "qwen3", max_len=4096)
    tok = AutoTokenizer.from_pretrained(d)
    tok.chat_template = (Path(trl.__file__).parent / "chat_templates" / "qwen3.jinja").read_text()
    tok.save_pretrained(d)
    return d


def _chat_rows(path: Path, n: int = 8) -> Path:
    rows = [{"prompt": [{"role": "user", "content": PROMPTS[i % 4]}], "answer": "5"} for i in range(n)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _script(monkeypatch, turns):
    """TRL's generation of turn k (k tool results so far in the prompt) returns `turns[k](i)` for the
    i-th sequence while k < len(turns), then the model generates for real."""
    from trl import GRPOTrainer

    real = GRPOTrainer._generate_single_turn

    def scripted(self, prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False):
        texts = self.processing_class.batch_decode(prompt_ids)
        done = [t.count("<tool_response>") for t in texts]
        if all(k >= len(turns) for k in done):
            return real(self, prompt_ids, images, multimodal_fields, num_generations, has_tool_images)
        eos = self.processing_class.eos_token_id
        return [self.processing_class(turns[k](i), add_special_tokens=False)["input_ids"] + [eos]
                for i, k in enumerate(done)], None

    monkeypatch.setattr(GRPOTrainer, "_generate_single_turn", scripted)


def _write(tmp_path, model, data, **over) -> Path:
    cfg = train_config(model, data, tmp_path / "out", **{
        "objective": "grpo", "method": "lora", "train.per_device_batch_size": 4, "train.max_steps": 2,
        "grpo.num_generations": 2, "grpo.max_completion_length": 200, "data.max_seq_length": 1024, **over})
    path = tmp_path / "train.yaml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return path


TOOLS = '''
import json, os

with open(os.environ["TOOL_LOG"] + ".imports", "a") as f:  # the module's own code: run once per process
    f.write("imported\\n")

def add(a: int, b: int) -> int:
    """Adds two integers.

    Args:
        a: the first integer
        b: the second integer
    """
    with open(os.environ["TOOL_LOG"], "a") as f:
        f.write(json.dumps([a, b]) + "\\n")
    return a + b


def used_the_tool(prompts, completions, **kw):
    """1 where the conversation holds add's result, 5, and a turn after it."""
    with open(os.environ["SEEN_LOG"], "a") as f:
        for c in completions:
            f.write(json.dumps(c) + "\\n")
    return [1.0 if any(m["role"] == "tool" and m["content"] == "5" for m in c) else 0.0 for c in completions]
'''


def test_a_tool_call_runs_the_tool_and_its_result_reaches_the_reward(tmp_path, tool_model, monkeypatch):
    """Even sequences call add(2, 3), odd ones add(a=2) (a TypeError inside TRL's loop: a failed call)."""
    monkeypatch.setenv("TOOL_LOG", str(tmp_path / "tool.jsonl"))
    monkeypatch.setenv("SEEN_LOG", str(tmp_path / "seen.jsonl"))
    (tmp_path / "agent.py").write_text(TOOLS)
    _script(monkeypatch, [lambda i: _call("add", a=2, b=3) if i % 2 == 0 else _call("add", a=2)])
    cfg = _write(tmp_path, tool_model, _chat_rows(tmp_path / "d.jsonl"),
                 **{"grpo.tools": ["agent:add"], "grpo.rewards": [{"function": "agent:used_the_tool"}],
                    "grpo.max_tool_calling_iterations": 1})
    assert finetune.main(["--config", str(cfg)]) == 0
    # one file holds the tool and the reward: loaded for both, checked, tried and trained with, executed once
    assert (tmp_path / "tool.jsonl.imports").read_text().splitlines() == ["imported"]
    # the tool ran for real: 2 steps x 4 sequences, half with both arguments
    assert [json.loads(ln) for ln in (tmp_path / "tool.jsonl").read_text().splitlines()] == [[2, 3]] * 4
    seen = [json.loads(ln) for ln in (tmp_path / "seen.jsonl").read_text().splitlines()]
    trained = [c for c in seen if len(c) > 1]  # the trial call before the model loads: one stand-in message
    assert len(trained) == 8
    for c in trained:  # the whole conversation: the call, the tool's answer, the model's next turn
        assert c[0]["role"] == "assistant" and c[0]["tool_calls"][0]["function"]["name"] == "add"
        assert c[1]["role"] == "tool" and c[1]["name"] == "add"
        assert [m["role"] for m in c[2:]] in (["assistant"], [])  # [] where the model's turn was all truncated
    assert sorted(c[1]["content"] for c in trained).count("5") == 4
    assert all("error" in c[1]["content"] for c in trained if c[1]["content"] != "5")
    rows = [json.loads(ln) for ln in (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()]
    for r in rows:
        assert r["reward"] == 0.5 and r["tools/calls"] == 4 and r["tools/failures"] == 2
        assert r["tools/call_frequency"] == 1.0 and r["tools/failure_frequency"] == 0.5
        assert 1 < r["tools/turns"] <= 2
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["objective"]["tools/calls"] == {"first": 4.0, "last": 4.0}
    assert summary["objective"]["rewards/used_the_tool/mean"]["last"] == 0.5


ENV = '''
import json, os

class Guess:
    """Guess the number, 7: each guess answered higher, lower or correct."""

    def __init__(self):
        self.guesses = []

    def reset(self, **row):
        self.guesses = []
        self.row = row
        return " (a number from 1 to 9)"

    def guess(self, n: int) -> str:
        """Guess the hidden number.

        Args:
            n: the number guessed
        """
        self.guesses.append(n)
        return "correct" if n == 7 else "higher" if n < 7 else "lower"

    def get_reward(self) -> float:
        with open(os.environ["ENV_LOG"], "a") as f:
            f.write(json.dumps({"guesses": self.guesses, "answer": self.row["answer"]}) + "\\n")
        return 1.0 if self.guesses and self.guesses[-1] == 7 else 0.0


def in_two(completions, environments, **kw):
    """A reward function reading each rollout's environment (TRL's environments=)."""
    return [1.0 if e.guesses == [3, 7] else 0.0 for e in environments]
'''


def test_an_environment_of_two_turns(tmp_path, tool_model, monkeypatch):
    """Each rollout guesses 3 (higher), then 7 (correct): two tool turns, then the model's own; the
    environment's get_reward is a reward beside a function that reads the environments; reset saw the row."""
    monkeypatch.setenv("ENV_LOG", str(tmp_path / "env.jsonl"))
    (tmp_path / "game.py").write_text(ENV)
    _script(monkeypatch, [lambda i: _call("guess", n=3), lambda i: _call("guess", n=7)])
    cfg = _write(tmp_path, tool_model, _chat_rows(tmp_path / "d.jsonl"),
                 **{"grpo.environment": "game:Guess", "grpo.max_tool_calling_iterations": 2,
                    "grpo.rewards": [{"function": "game:in_two"}],
                    "grpo.max_completion_length": 320})
    assert finetune.main(["--config", str(cfg)]) == 0
    log = [json.loads(ln) for ln in (tmp_path / "env.jsonl").read_text().splitlines()]
    assert log == [{"guesses": [3, 7], "answer": "5"}] * 8
    rows = [json.loads(ln) for ln in (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()]
    for r in rows:
        assert r["reward"] == 2.0 and r["rewards/Guess/mean"] == 1.0 and r["rewards/in_two/mean"] == 1.0
        assert r["tools/calls"] == 8 and r["tools/failures"] == 0 and r["tools/max_turns"] == 3


BAD_TOOLS = {
    "no_hints": ("def add(a, b):\n    '''Adds.\n\n    Args:\n        a: one\n        b: two\n    '''\n    return a + b\n",
                 "grpo.tools.0: agent:add: Argument a is missing a type hint in function add"),
    "no_docstring": ("def add(a: int, b: int) -> int:\n    return a + b\n",
                     "grpo.tools.0: agent:add: Cannot generate JSON schema for add because it has no docstring"),
    "undocumented_arg": ("def add(a: int, b: int) -> int:\n    '''Adds.\n\n    Args:\n        a: one\n    '''\n"
                         "    return a + b\n", "the docstring has no description for the argument 'b'"),
    "not_a_function": ("add = 3\n", "grpo.tools.0: agent:add is a int, not a function"),
    "missing": ("def sub(a: int) -> int:\n    '''S.\n\n    Args:\n        a: x\n    '''\n    return a\n",
                "grpo.tools.0: agent:add: module 'agent' has no 'add'"),
    "import_fails": ("import no_such_module_here\n", "grpo.tools.0: " ),
}


@pytest.mark.parametrize("case", sorted(BAD_TOOLS))
def test_a_bad_tool_is_refused_before_the_model(tmp_path, tool_model, capsys, case):
    code, expect = BAD_TOOLS[case]
    (tmp_path / "agent.py").write_text(code)
    data = _chat_rows(tmp_path / "d.jsonl")
    err = _refused(capsys, tmp_path, tool_model, data, [expect], objective="grpo", method="lora",
                   **{"grpo.tools": ["agent:add"], "grpo.rewards": [{"function": "length", "max_chars": 9}],
                      "train.per_device_batch_size": 4, "grpo.num_generations": 2, "data.max_seq_length": 1024})
    assert "t.yaml:" in err  # the line of the entry


def test_a_bad_environment_and_a_template_without_tools_are_refused(tmp_path, tool_model, tiny_model, capsys):
    over = {"grpo.rewards": [{"function": "length", "max_chars": 9}], "train.per_device_batch_size": 4,
            "grpo.num_generations": 2, "data.max_seq_length": 1024, "objective": "grpo", "method": "lora"}
    data = _chat_rows(tmp_path / "d.jsonl")
    (tmp_path / "game.py").write_text(
        "class NoReset:\n    pass\n\nclass Needs:\n    def __init__(self, seed):\n        pass\n    def reset(self, **r):\n"
        "        pass\n\nclass Untyped:\n    def reset(self, **r):\n        pass\n    def move(self, x):\n        return x\n"
        "def fn():\n    pass\n"
        "def add(a: int) -> int:\n    '''Adds.\n\n    Args:\n        a: one\n    '''\n    return a\n")
    for env, expect in (("game:NoReset", "grpo.environment: game:NoReset has no reset method"),
                        ("game:Needs", "grpo.environment: game:Needs: cannot be made with no arguments"),
                        ("game:Untyped", "grpo.environment: game:Untyped.move (a public method: a tool the model "
                                         "may call): Cannot generate JSON schema for move because it has no docstring"),
                        ("game:fn", "grpo.environment: game:fn is a function, not a class")):
        _refused(capsys, tmp_path, tool_model, data, [expect], **over, **{"grpo.environment": env})
    # Llama's tiny template of tests/helpers/tiny.py renders only role and content: no tool call survives
    _refused(capsys, tmp_path, tiny_model, data, [f"grpo.tools: the chat template of {tiny_model} cannot render a "
                                                   "tool call"], **{**over, "data.max_seq_length": 128, "grpo.tools": ["game:add"]})
    # plain-text prompts: TRL finds calls only in chat completions
    plain = tmp_path / "p.jsonl"
    plain.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in PROMPTS * 2))
    _refused(capsys, tmp_path, tool_model, plain, ["grpo.tools: data.path: the prompts are plain text"],
             **over, **{"grpo.tools": ["game:add"]})
    # the fields without tools, and a name that is not module:name, are config errors
    _refused(capsys, tmp_path, tool_model, data, ["max_tool_calling_iterations belongs to tools or an environment"],
             **over, **{"grpo.max_tool_calling_iterations": 2})
    _refused(capsys, tmp_path, tool_model, data, ["'add': expected module:name"], **over, **{"grpo.tools": ["add"]})


def test_kl_reaches_the_summary(tmp_path, tiny_model):
    """beta > 0: TRL logs kl every step; metrics.jsonl and summary.json keep it (it was dropped)."""
    from helpers import pref

    data = pref.write(tmp_path / "g.jsonl", "prompt", 8)
    cfg = _write(tmp_path, tiny_model, data, **{"grpo.beta": 0.1, "grpo.max_completion_length": 4,
                                               "data.max_seq_length": 48,
                                               "grpo.rewards": [{"function": "length", "max_chars": 9}]})
    assert finetune.main(["--config", str(cfg)]) == 0
    rows = [json.loads(ln) for ln in (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()]
    assert all("kl" in r for r in rows) and len(rows) == 2
    got = json.loads((tmp_path / "out" / "summary.json").read_text())["objective"]
    assert got["kl"] == {"first": rows[0]["kl"], "last": rows[-1]["kl"]}
    assert {"reward", "reward_std", "rewards/length/mean"} <= got.keys()


def test_an_environment_that_owns_the_reward_needs_no_reward_functions(tmp_path, tool_model, monkeypatch):
    """No grpo.rewards: the environment's get_reward is the reward (TRL adds it, weight 1)."""
    monkeypatch.setenv("ENV_LOG", str(tmp_path / "env.jsonl"))
    (tmp_path / "game.py").write_text(ENV)
    _script(monkeypatch, [lambda i: _call("guess", n=7 if i % 2 else 9)])
    cfg = _write(tmp_path, tool_model, _chat_rows(tmp_path / "d.jsonl"),
                 **{"grpo.environment": "game:Guess", "grpo.max_tool_calling_iterations": 1, "train.max_steps": 1})
    assert finetune.main(["--config", str(cfg)]) == 0
    assert [json.loads(ln)["guesses"] for ln in (tmp_path / "env.jsonl").read_text().splitlines()] == [[9], [7]] * 2
    (row,) = [json.loads(ln) for ln in (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()]
    assert row["reward"] == 0.5 and row["rewards/Guess/mean"] == 0.5


def test_the_summary_keeps_a_metric_logged_on_some_steps_only():
    """The summary's objective block comes from the rows metrics.jsonl holds: a metric missing from the
    last row (logged on some steps only) keeps its own first and last; a family (tools/*) matches."""
    from toolbox_train.training.trainer import is_kept, objective_span

    rows = [{"step": 1, "loss": 1.0, "reward": 1.0}, {"step": 2, "loss": 0.9, "reward": 2.0, "kl": 0.1},
            {"step": 3, "loss": 0.8, "reward": 3.0, "kl": 0.3, "tools/calls": 4.0}, {"step": 4, "loss": 0.7, "reward": 4.0}]
    got = objective_span(rows, ("reward", "kl", "tools/*"))
    assert got == {"reward": {"first": 1.0, "last": 4.0}, "kl": {"first": 0.1, "last": 0.3},
                   "tools/calls": {"first": 4.0, "last": 4.0}}
    assert is_kept("rewards/my_fn/mean", ("rewards/*",)) and not is_kept("loss", ("rewards/*", "kl"))


def test_backend_auto_takes_hf_for_tools_and_environments():
    """TRL's tool loop is the one tested; Unsloth's patched GRPO trainer stays the pick without them."""
    from toolbox_train.config.schema import TrainConfig
    from toolbox_train.planning.run import pick_backend

    base = {"model": {"path": "m"}, "data": {"path": "d.jsonl"}, "output": {"dir": "o"}, "objective": "grpo"}
    for grpo, want in (({}, "unsloth"), ({"tools": ["a:f"]}, "hf"), ({"environment": "a:C"}, "hf")):
        cfg = TrainConfig.model_validate({**base, "grpo": grpo})
        assert pick_backend(cfg, gpu=True, fsdp=False, machine="image") == want, grpo
