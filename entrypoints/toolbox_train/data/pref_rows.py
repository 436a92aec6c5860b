"""Rows of the preference objectives in TRL's dataset types, standard (strings) or conversational
(lists of {role, content}), checked before anything heavy runs:

  preference (dpo, orpo)  prompt (optional: implicit, the shared start), chosen, rejected
  unpaired (kto)          prompt, completion, label (true: desirable)
  prompt (grpo)           prompt (every other column reaches the reward functions)

A missing field, a chosen equal to its rejected, an empty completion (after an implicit prompt is
taken out) are refused naming the file and line (rowcheck.py does the naming).
"""

from __future__ import annotations

from typing import Any

FORMATS = ("preference", "unpaired", "prompt")
COLUMNS = {"preference": ("prompt", "chosen", "rejected"), "unpaired": ("prompt", "completion", "label"),
           "prompt": ("prompt",)}
# What TRL 1.15's GRPOTrainer passes every reward function besides the data's other columns
# (_calculate_rewards): a column of one of these names would collide with it.
REWARD_ARGS = ("prompts", "completions", "completion_ids", "trainer_state", "log_extra", "log_metric",
               "environments")
HINT = {"preference": "prompt (optional), chosen, rejected", "unpaired": "prompt, completion, label",
        "prompt": "prompt"}


def _kind(v: Any) -> str | None:
    """'text' (a string), 'chat' (a non-empty list of {role, content} strings), or None."""
    if isinstance(v, str):
        return "text"
    if isinstance(v, list) and v and all(isinstance(m, dict) and isinstance(m.get("role"), str)
                                         and isinstance(m.get("content"), str) for m in v):
        return "chat"
    return None


def _empty(v: Any, kind: str) -> bool:
    return not (v.strip() if kind == "text" else v[-1]["content"].strip())


def shared_prefix(chosen, rejected) -> int:
    """Where an implicit prompt ends, as TRL's extract_prompt splits it (a space before the
    differing character stays with the completions)."""
    n = 0
    for a, b in zip(chosen, rejected):
        if a != b:
            break
        n += 1
    if n < min(len(chosen), len(rejected)) and n > 0 and chosen[n - 1] == " ":
        n -= 1
    return n


def _field(row: dict, key: str, fmt: str) -> str | None:
    if row.get(key) is None:
        return f"no {key!r} field ({fmt} format: {HINT[fmt]})"
    if _kind(row[key]) is None:
        return f"{key!r} must be a string or a non-empty list of {{\"role\": string, \"content\": string}}"
    return None


def problem(row: dict[str, Any], fmt: str) -> str | None:
    """What is wrong with one row for `fmt` (preference, unpaired, prompt), or None."""
    implicit = fmt == "preference" and row.get("prompt") is None
    needed = [k for k in COLUMNS[fmt] if not (implicit and k == "prompt")]
    for key in needed:
        if key == "label":
            if not isinstance(row.get(key), bool):
                return ("no 'label' field" if row.get(key) is None else "'label' must be true or false") + \
                    f" ({fmt} format: {HINT[fmt]})"
            continue
        why = _field(row, key, fmt)
        if why:
            return why
    kinds = {k: _kind(row[k]) for k in needed if k != "label"}
    if len(set(kinds.values())) > 1:
        names = [repr(k) for k in kinds]
        return f"{', '.join(names[:-1])} and {names[-1]} must all be strings or all conversations"
    kind = next(iter(kinds.values()))
    if fmt == "prompt":
        return "'prompt' is empty" if _empty(row["prompt"], kind) else None
    if fmt == "unpaired":
        return "'completion' is empty" if _empty(row["completion"], kind) else None
    chosen, rejected = row["chosen"], row["rejected"]
    if chosen == rejected:
        return "'chosen' equals 'rejected' (nothing to prefer)"
    if implicit:  # the prompt is the shared start of chosen and rejected: the shared start of chosen and rejected
        n = shared_prefix(chosen, rejected)
        chosen, rejected = chosen[n:], rejected[n:]
        for key, rest in (("chosen", chosen), ("rejected", rejected)):
            if not rest or _empty(rest, kind):
                return (f"{key!r} is empty once the implicit prompt (the start shared with "
                        f"{'rejected' if key == 'chosen' else 'chosen'}) is taken out")
        return None
    for key, v in (("chosen", chosen), ("rejected", rejected)):
        if _empty(v, kind):
            return f"{key!r} is empty"
    return None
