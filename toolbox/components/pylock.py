"""The stack's Python lock (toolbox.stack.pylock): installed with --require-hashes.

No templates of its own: torch.j2 installs from its torch part while torch's pins still match
the lock (`python_lock_torch`), hf.j2 from the whole lock while every pin does (`python_lock`).
The used lock's sha256 is a pin, so a different dependency set never shares an image tag.
"""

import hashlib

from toolbox.stack import pylock
from toolbox.components import Component, ContextFile


def _parts(stack) -> tuple[str | None, str | None]:
    """(torch part, whole lock) as far as each still holds for the stack's pins; no torch part
    where AMD's index serves torch (first-use: not in the lock)."""
    torch_lock, whole = pylock.torch_current(stack), pylock.current(stack)
    torch_part = pylock.split(torch_lock.read_text(encoding="utf-8"))[0] if torch_lock else None
    everything = pylock.split(whole.read_text(encoding="utf-8"))[1] if whole else None
    return torch_part or None, everything


def _pins(stack):
    torch_part, everything = _parts(stack)
    pins = {}
    if torch_part is not None:
        pins["python.lock.torch.sha256"] = hashlib.sha256(torch_part.encode()).hexdigest()
    if everything is not None:
        pins["python.lock.sha256"] = pylock.content_digest(pylock.current(stack))
    return pins


def _context(stack):
    torch_part, everything = _parts(stack)
    out = [] if torch_part is None else [ContextFile("python-lock/torch.txt", text=torch_part)]
    return out + ([] if everything is None else [ContextFile("python-lock/all.txt", text=everything)])


COMPONENT = Component("pylock", applies=lambda s: True, pins=_pins, context=_context,
                      variables=lambda s, pin_set: {"python_lock_torch": "python.lock.torch.sha256" in pin_set.pins,
                                                 "python_lock": "python.lock.sha256" in pin_set.pins})
