"""Reward functions named in a section's `rewards` (an objective unit's that scores completions, with
the field they are written under: `grpo.rewards`): three built-ins (a format check by regex, a length
penalty, python_tests: the code against the row's tests in the sandbox) and `module:function`, a
module.py beside the config or an installed module, or a reward model's folder. Resolved and called
once on a few rows (`trial`) before the model loads, so a typo, a function that raises or returns no
number per completion, a sandbox that cannot run here, is exit 2, not a failure after loading.

A reward function is TRL's: `f(prompts, completions, **columns) -> list[float]`, one per
completion; conversational completions are lists of messages (the text is the last's content).
"""

from __future__ import annotations

import asyncio
import hashlib
import importlib
import importlib.util
import inspect
import math
import numbers
import re
import sys
from pathlib import Path
from typing import Callable

from toolbox_train import sandbox
from toolbox_train.contract import UserError, first_line


def _text(c) -> str:
    return c[-1]["content"] if isinstance(c, list) and c else str(c)


def format_reward(pattern: str) -> Callable:
    rx = re.compile(pattern, re.DOTALL)

    def format(completions, **_):  # TRL names the metric after the function: rewards/format/mean
        return [1.0 if rx.search(_text(c)) else 0.0 for c in completions]

    return format


def length_penalty(max_chars: int) -> Callable:
    def length(completions, **_):  # 0 up to max_chars, then -1 per max_chars characters beyond
        return [-max(0, len(_text(c)) - max_chars) / max_chars for c in completions]

    return length


def _module(name: str, base: Path, field: str):
    beside = base / (name.replace(".", "/") + ".py")
    if beside.is_file():
        # Executed once per process: preflight's resolve and the run's find the module of the same file
        # (the same bytes) in sys.modules, as an installed module's import does.
        stamp = (str(beside.resolve()), hashlib.sha256(beside.read_bytes()).hexdigest())
        known = sys.modules.get(f"toolbox_rewards.{name}")
        if getattr(known, "__toolbox_stamp__", None) == stamp:
            return known
        spec = importlib.util.spec_from_file_location(f"toolbox_rewards.{name}", beside)
        mod = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = mod  # pickling (dataloader workers) finds it again
        try:
            spec.loader.exec_module(mod)
        except Exception as exc:
            sys.modules.pop(spec.name, None)  # a module that failed half-way is not kept
            raise UserError(f"{field}: {beside}: importing it failed: {first_line(exc)}") from None
        mod.__toolbox_stamp__ = stamp
        return mod
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name and name.startswith(exc.name):
            raise UserError(f"{field}: no {beside.name} beside the config ({base}) and no installed module "
                            f"{name!r}") from None
        raise UserError(f"{field}: importing {name!r} failed: {first_line(exc)}") from None
    except Exception as exc:
        raise UserError(f"{field}: importing {name!r} failed: {first_line(exc)}") from None


def label(i: int, r, field: str) -> str:
    """The entry as messages name it: `grpo.rewards.0.function format`, `grpo.rewards.1.model PATH`
    (`field`: where the list is written, `grpo.rewards`)."""
    return f"{field}.{i}.function {r.function}" if r.function else f"{field}.{i}.model {r.model}"


def reward_model(path: str, base: Path, field: str) -> str:
    """The folder of a reward model entry, checked before anything loads: a sequence-classification
    model with one label (what TRL's GRPOTrainer loads from a path: AutoModelForSequenceClassification,
    num_labels=1). A LoRA run of objective reward is an adapter: its merged model is the folder to give."""
    import json

    folder = Path(path).expanduser()
    folder = (folder if folder.is_absolute() else base / folder).resolve()
    if not folder.is_dir():
        raise UserError(f"{field}: {folder}: no such folder (a reward model's folder: a run that trained one)")
    cfg = folder / "config.json"
    if not cfg.is_file():
        adapter = (folder / "adapter_config.json").is_file()
        raise UserError(f"{field}: {folder}: no config.json" + (
            " (a LoRA adapter: give its merged model, output.save: merged or both)" if adapter else
            " (not a model folder)"))
    try:
        mc = json.loads(cfg.read_text())
    except (OSError, ValueError) as exc:
        raise UserError(f"{field}: {cfg}: not readable as JSON ({first_line(exc)})") from None
    arch = [a for a in mc.get("architectures") or [] if a.endswith("ForSequenceClassification")]
    labels = len(mc["id2label"]) if isinstance(mc.get("id2label"), dict) else mc.get("num_labels", 2)
    if not arch or labels != 1:
        raise UserError(f"{field}: {folder}: not a reward model (architectures {mc.get('architectures')}, "
                        f"{labels} labels; expected a *ForSequenceClassification with one label, as a run that "
                        "trained a reward model saves)")
    return str(folder)


def resolve(rewards, base: Path, where: str) -> tuple[list[Callable | str], list[float]]:
    """(reward functions, weights) of the entries `rewards` written at `where` (`grpo.rewards`), a reward
    model as its checked folder (TRL loads it); UserError naming the entry otherwise."""
    if not rewards:
        raise UserError(f"{where}: the objective needs at least one reward function "
                        "(format, length, python_tests, or module:function) or reward model")
    funcs = []
    for i, r in enumerate(rewards):
        field = f"{where}.{i}.function"
        if r.model is not None:
            funcs.append(reward_model(r.model, base, f"{where}.{i}.model"))
        elif r.function == "format":
            funcs.append(format_reward(r.pattern))
        elif r.function == "length":
            funcs.append(length_penalty(r.max_chars))
        elif r.function == "python_tests":
            limits = r.sandbox or sandbox.Limits()
            why = sandbox.probe(limits)  # a sandbox that cannot run here would score every completion 0
            if why:
                raise UserError(f"{field}: python_tests: the sandbox does not run here: {why}")
            funcs.append(sandbox.python_tests(limits))
        else:
            mod_name, _, attr = r.function.partition(":")
            mod = _module(mod_name, base, field)
            if not hasattr(mod, attr):
                raise UserError(f"{field}: {r.function}: module {mod_name!r} has no function {attr!r}")
            fn = getattr(mod, attr)
            if not callable(fn):
                raise UserError(f"{field}: {r.function}: {mod_name}.{attr} is a {type(fn).__name__}, not callable")
            funcs.append(fn)
    return funcs, [r.weight for r in rewards]


TRIAL_ROWS = 4  # rows each reward function is called on before the model loads


def stand_in(prompt):
    """The completion of the trial call: the prompt's own text (a conversation: its last message's
    text, as an assistant message), so that a reward function sees text of its own data's kind."""
    return [{"role": "assistant", "content": _text(prompt)}] if isinstance(prompt, list) else prompt


def _problem(out, n: int) -> str | None:
    """What is wrong with a reward function's output for n completions, or None."""
    if isinstance(out, (str, bytes, dict)) or not hasattr(out, "__len__") or not hasattr(out, "__iter__"):
        return f"returned {type(out).__name__}, not a list of numbers"
    if len(out) != n:
        return f"returned {len(out)} rewards for {n} completions (one per completion)"
    for k, x in enumerate(out):
        if x is None:
            return f"returned None for completion {k + 1} (a missing reward: every completion needs a number)"
        number = isinstance(x, numbers.Real) or (hasattr(x, "item") and getattr(x, "ndim", None) == 0)
        if not number or isinstance(x, (str, bytes)):
            return f"returned {type(x).__name__} {str(x)[:40]!r} for completion {k + 1}, not a number"
        if not math.isfinite(float(x)):
            return f"returned {float(x)} for completion {k + 1}"
    return None


def trial(rewards, funcs, ds, tok, field: str, where: str, extra=None) -> None:
    """Each reward function called as TRL's GRPOTrainer calls it (_calculate_rewards: prompts,
    completions, completion_ids, the data's other columns, trainer_state, log_extra, log_metric), on
    the first rows of `ds` with stand-in completions; UserError naming the function (`where`: the
    entries' field, `grpo.rewards`) otherwise."""
    from transformers import TrainerState

    rows = ds.select(range(min(TRIAL_ROWS, len(ds)))).to_list()
    prompts = [r["prompt"] for r in rows]
    completions = [stand_in(p) for p in prompts]
    kw = {k: [r[k] for r in rows] for k in rows[0] if k not in ("prompt", "completion", "completion_ids")}
    kw.update(completion_ids=[tok(_text(c), add_special_tokens=False)["input_ids"] for c in completions],
              trainer_state=TrainerState(), log_extra=lambda *a, **k: None, log_metric=lambda *a, **k: None)
    if extra is not None:  # what the trainer passes besides (an environment per rollout: extra(rows))
        kw.update(extra(rows))
    how = (f"(called before the model loads on {len(rows)} rows of {field}, each prompt's own text standing in "
           "for its completion)")
    for i, (r, fn) in enumerate(zip(rewards, funcs)):
        if isinstance(fn, str):
            continue  # a reward model: its folder is checked; TRL loads and runs it
        name = f"{where}.{i}.function: {r.function}"
        try:
            out = fn(prompts=prompts, completions=completions, **kw)
            if inspect.isawaitable(out):  # TRL runs async reward functions too
                out = asyncio.run(out)
        except Exception as exc:
            raise UserError(f"{name}: raised {type(exc).__name__}: {first_line(exc, 200)} {how}") from None
        why = _problem(out, len(prompts))
        if why:
            raise UserError(f"{name}: {why} {how}")


def load(rewards, base: Path, where: str, tok=None, sets=(), extra=None) -> tuple[list, list[float]]:
    """(functions, weights) of the entries `rewards` (written at `where`), each resolved once; with `tok`
    and `sets` ((dataset, field), ...) each function called on a few rows of each (`trial`)."""
    funcs, weights = resolve(rewards, base, where)
    for ds, field in sets:
        trial(rewards, funcs, ds, tok, field, where, extra)
    return funcs, weights
