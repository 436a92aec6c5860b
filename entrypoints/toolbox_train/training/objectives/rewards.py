"""GRPO reward functions named in the config: two built-ins (a format check by regex, a length
penalty) and `module:function`, a module.py beside the config or an installed module. Resolved
before the model loads, so a typo is exit 2, not a failure after loading.

A reward function is TRL's: `f(prompts, completions, **columns) -> list[float]`, one per
completion; conversational completions are lists of messages (the text is the last's content).
"""

from __future__ import annotations

import importlib
import importlib.util
import re
import sys
from pathlib import Path
from typing import Callable

from ...cli import UserError, first_line


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
        spec = importlib.util.spec_from_file_location(f"toolbox_rewards.{name}", beside)
        mod = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = mod  # pickling (dataloader workers) finds it again
        try:
            spec.loader.exec_module(mod)
        except Exception as exc:
            raise UserError(f"{field}: {beside}: importing it failed: {first_line(exc)}") from None
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


def resolve(cfg, base: Path) -> tuple[list[Callable], list[float]]:
    """(reward functions, weights) of `grpo.rewards`; UserError naming the entry otherwise."""
    rewards = cfg.grpo.rewards
    if not rewards:
        raise UserError("grpo.rewards: objective grpo needs at least one reward function "
                        "(format, length, or module:function)")
    funcs = []
    for i, r in enumerate(rewards):
        field = f"grpo.rewards.{i}.function"
        if r.function == "format":
            funcs.append(format_reward(r.pattern))
        elif r.function == "length":
            funcs.append(length_penalty(r.max_chars))
        else:
            mod_name, _, attr = r.function.partition(":")
            fn = getattr(_module(mod_name, base, field), attr, None)
            if not callable(fn):
                raise UserError(f"{field}: {r.function}: module {mod_name!r} has no function {attr!r}")
            funcs.append(fn)
    return funcs, [r.weight for r in rewards]
