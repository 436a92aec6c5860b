"""The stack's Python lock (toolbox.stack.python_lock): installed with --require-hashes.

No templates of its own: torch.j2 installs from its torch part while torch's pins still match
the lock (`exports.pylock.torch`), hf.j2 from the whole lock while every pin does (`exports.pylock.whole`).
The used lock's sha256 is a pin, so a different dependency set never shares an image tag.
What the lock holds for these pins is read once, when the stack is resolved (`stack.python_lock`,
toolbox.stack.python_lock.LockState); this component only passes it on.
"""

import hashlib

from toolbox.components import Component, ContextFile


def _parts(stack) -> tuple[str | None, str | None]:
    """(torch part, whole lock) as far as each still holds for the stack's pins; no torch part
    where AMD's index serves torch (first-use: not in the lock). With a `ray:` block, the whole
    lock leaves out what only ray pulls in: ray_part() has it, for the ray layer."""
    return stack.python_lock.torch_part, stack.python_lock.everything


def ray_part(stack) -> str | None:
    """The lock lines of ray[train] and what only it pulls in (None: no ray block, or a stale lock)."""
    return stack.python_lock.ray_part


def _pins(stack):
    torch_part, everything = _parts(stack)
    pins = {}
    if torch_part is not None:
        pins["python.lock.torch.sha256"] = hashlib.sha256(torch_part.encode()).hexdigest()
    if everything is not None:
        pins["python.lock.sha256"] = stack.python_lock.digest
    return pins


def _context(stack):
    torch_part, everything = _parts(stack)
    out = [] if torch_part is None else [ContextFile("python-lock/torch.txt", text=torch_part)]
    out += [] if everything is None else [ContextFile("python-lock/all.txt", text=everything)]
    ray = ray_part(stack)
    return out + ([] if ray is None else [ContextFile("python-lock/ray.txt", text=ray)])


COMPONENT = Component("pylock", place=100, applies=lambda s: True, pins=_pins, context=_context,
                      # whether torch's step (torch) and the later ones (whole) install from the lock
                      exports=lambda s: {"torch": "python.lock.torch.sha256" in s.pin_set.pins,
                                         "whole": "python.lock.sha256" in s.pin_set.pins})
