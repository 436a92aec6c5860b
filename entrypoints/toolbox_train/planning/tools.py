"""Tools an objective that generates lets the model call (a section's `tools`, `module:function`) and
an environment class (`environment`, `module:Class`), found as reward functions are (a module.py beside
the config, or an installed module: planning/rewards.py's loader, so a module both use runs once), and
checked before the model loads, as TRL 1.15's GRPOTrainer needs them:

- a tool is a plain function (sync or async) whose every argument has a type hint and a line in its
  Google-style docstring: transformers' `get_json_schema` turns it into the schema the chat template
  renders (the model sees its name, arguments and docstring), as TRL does when it renders the prompts;
- an environment is a class whose instances TRL makes with no arguments (`environment_factory`), one
  per rollout, with a `reset(**row)` (None, or text appended to the last user message) and optionally
  `get_reward()` (a float per rollout, an extra reward of weight 1); its other public methods are its
  tools, held to the same rule;
- the model's chat template renders a tool-calling conversation (TRL's `supports_tool_calling`), TRL can
  parse the model's tool calls out of its text (a response template it knows) and can keep the
  template prefix-preserving across turns (`get_training_chat_template`);
- the prompts are conversations (TRL finds tool calls only in parsed chat completions).

Each refusal is one line naming the field (`grpo.tools.0`, `grpo.environment`).
"""

from __future__ import annotations

import copy
import inspect
from pathlib import Path
from typing import Callable

from toolbox_train.contract import UserError, first_line
from toolbox_train.planning.rewards import _module as user_module

ENTRY = r"[A-Za-z_][\w.]*:[A-Za-z_]\w*"  # module:name, as a reward function's


def _attr(entry: str, base: Path, field: str):
    mod_name, _, attr = entry.partition(":")
    mod = user_module(mod_name, base, field)
    if not hasattr(mod, attr):
        raise UserError(f"{field}: {entry}: module {mod_name!r} has no {attr!r}")
    return getattr(mod, attr)


def schema_problem(fn: Callable) -> str | None:
    """Why `fn` cannot be a tool the chat template renders (transformers' get_json_schema, which TRL's
    prompts go through), or None."""
    from transformers.utils.chat_template_utils import get_json_schema

    try:
        get_json_schema(fn)
    except Exception as exc:  # TypeHintParsingException, DocstringParsingException, a bad signature
        return (f"{first_line(exc, 200)} (a tool needs a type hint on every argument and a Google-style "
                "docstring with an Args: line for each: the model reads them)")
    return None


def function(entry: str, base: Path, field: str) -> Callable:
    """The tool `entry` (`module:function`), checked; UserError naming `field` otherwise."""
    fn = _attr(entry, base, field)
    if not (inspect.isfunction(fn) or inspect.ismethod(fn)):
        raise UserError(f"{field}: {entry} is a {type(fn).__name__}, not a function (TRL calls tools by their "
                        "function name with the arguments the model wrote)")
    why = schema_problem(fn)
    if why:
        raise UserError(f"{field}: {entry}: {why}")
    return fn


def environment(entry: str, base: Path, field: str) -> type:
    """The environment class `entry` (`module:Class`), checked without making one; UserError otherwise."""
    cls = _attr(entry, base, field)
    if not inspect.isclass(cls):
        raise UserError(f"{field}: {entry} is a {type(cls).__name__}, not a class (TRL makes one instance per "
                        "rollout by calling it with no arguments)")
    try:
        inspect.signature(cls).bind()
    except TypeError as exc:
        raise UserError(f"{field}: {entry}: cannot be made with no arguments ({first_line(exc)})") from None
    except ValueError:
        pass  # no signature to read (a C type): TRL's call will say
    members = dict(inspect.getmembers(cls, predicate=inspect.isfunction))
    if "reset" not in members:
        raise UserError(f"{field}: {entry} has no reset method (TRL calls reset(**row) before each rollout)")
    for name, fn in members.items():
        if name in ("reset", "get_reward") or name.startswith("_"):
            continue
        why = schema_problem(fn)
        if why:
            raise UserError(f"{field}: {entry}.{name} (a public method: a tool the model may call): {why}")
    return cls


def tool_names(tools, env: type | None) -> list[str]:
    return [t.__name__ for t in tools] + [n for n, _ in inspect.getmembers(env or object, inspect.isfunction)
                                          if n not in ("reset", "get_reward") and not n.startswith("_")]


def load(entries, env_entry: str | None, base: Path, where: str) -> tuple[list[Callable], type | None]:
    """(tool functions, environment class) of a section's `tools` and `environment` (written under
    `where`: `grpo`), each checked; two tools of one name (TRL finds them by name) refused."""
    tools = [function(e, base, f"{where}.tools.{i}") for i, e in enumerate(entries)]
    env = environment(env_entry, base, f"{where}.environment") if env_entry else None
    names = tool_names(tools, env)
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise UserError(f"{where}.tools: two tools named {twice[0]!r} (the model calls a tool by its name)")
    return tools, env


def check_template(tok, sets, model_path, where: str) -> None:
    """The model's chat template can carry tool calls (TRL 1.15's own checks, before the model loads), and
    the prompts of every dataset in `sets` ((dataset, field), ...) are conversations."""
    from trl.chat_template_utils import (add_response_schema, get_training_chat_template,
                                         is_chat_template_prefix_preserving, supports_tool_calling)

    field = f"{where}.tools"
    if not supports_tool_calling(tok):
        raise UserError(f"{field}: the chat template of {model_path} cannot render a tool call (TRL renders user -> "
                        "assistant with tool_calls -> tool and finds neither the call nor its result); use a model "
                        "whose template has tool support, or give the tokenizer one")
    if getattr(tok, "response_template", None) is None and getattr(tok, "response_schema", None) is None:
        try:
            add_response_schema(copy.copy(tok))
        except ValueError:
            raise UserError(f"{field}: TRL 1.15 cannot parse tool calls out of {model_path}'s completions: its "
                            "tokenizer has no response_template and TRL knows none for its chat template "
                            "(Qwen 2.5/3/3.5, Llama 3.1/3.2, GPT-OSS, GLM-4 MoE, Gemma 4, ... do)") from None
    try:
        ok = is_chat_template_prefix_preserving(tok)
        if not ok:
            get_training_chat_template(tok)
    except Exception as exc:  # ValueError: TRL has no prefix-preserving version of this template
        raise UserError(f"{field}: {model_path}'s chat template renders earlier turns differently once a tool "
                        f"result follows, and TRL has no fixed version of it ({first_line(exc, 160)})") from None
    for ds, data_field in sets:
        if len(ds) and not isinstance(ds[0]["prompt"], list):
            raise UserError(f"{field}: {data_field}: the prompts are plain text; tool calls need conversational "
                            'prompts ({"prompt": [{"role": "user", "content": ...}]}: TRL finds a call only in '
                            "a parsed chat completion)")
