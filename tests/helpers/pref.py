"""Toy data for the preference objectives (tests/train/test_objectives*.py), in TRL's formats.

The preferred completion follows one fixed pattern (" the moon."), the other is any other object
of tiny.py's little world, so a 2-layer model learns the preference in a few steps.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

from helpers.tiny import _OBJECTS, _SUBJECTS, _VERBS

GOOD = " the moon."


def _prompts(n: int, seed: int) -> list[str]:
    rnd = random.Random(seed)
    return [f"{rnd.choice(_SUBJECTS)} {rnd.choice(_VERBS)}" for _ in range(n)]


def rows(kind: str, n: int = 64, seed: int = 0, chat: bool = False) -> list[dict]:
    """preference (prompt/chosen/rejected), implicit (chosen/rejected, prompt inside both),
    unpaired (prompt/completion/label) or prompt (prompt only); `chat`: conversational."""
    rnd = random.Random(seed + 1)
    out = []
    for p in _prompts(n, seed):
        bad = " " + rnd.choice([o for o in _OBJECTS if o != "the moon"]) + "."
        if chat:
            user, good, worse = ([{"role": "user", "content": p}], [{"role": "assistant", "content": GOOD.strip()}],
                                 [{"role": "assistant", "content": bad.strip()}])
        else:
            user, good, worse = p, GOOD, bad
        if kind == "preference":
            out.append({"prompt": user, "chosen": good, "rejected": worse})
        elif kind == "implicit":
            out.append({"chosen": user + good, "rejected": user + worse})
        elif kind == "unpaired":
            out += [{"prompt": user, "completion": good, "label": True},
                    {"prompt": user, "completion": worse, "label": False}]
        elif kind == "prompt":
            out.append({"prompt": user})
        else:
            raise ValueError(kind)
    return out


def write(path: str | Path, kind: str, n: int = 64, seed: int = 0, chat: bool = False) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows(kind, n, seed, chat)))
    return path
