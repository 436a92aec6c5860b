"""The walk of `toolbox build`'s inputs (issue 34): one stay per module where the data allows it.

tests/helpers/walk.py traces which host modules the parsed arguments, and what each step returns
from them, pass through. Before: the Python lock was found and read again by every component hook
that needed it (stack.python_lock entered 3-4 times, components.torch/hf/unsloth 7-19 times each,
77-105 stays a build), and render asked the components twice. Now the lock is read once when the
stack is resolved (`stack.python_lock`) and render asks each component once (`components.parts`).
The Stack's and the stack model's own methods (stack.resolved, stack.model, and the methods of
the blocks each component declares, e.g. `Base.ref`) are the data itself, consulted where it is
used; every other module is one stay.
"""

from __future__ import annotations

import collections

import pytest

from helpers.walk import stays, walk

DATA = {"toolbox.stack.resolved", "toolbox.stack.model"}


def model_visits_as_data(visits: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """Visits of a block's methods (declared in its component's module: components.base's Base.ref)
    counted as the stack model's, as the model's own: the component module is not entered for them."""
    import importlib
    import inspect

    from toolbox.components import Model

    def block_method(mod: str, fn: str) -> bool:
        m = importlib.import_module(mod)
        return any(fn in vars(c) for c in vars(m).values()
                   if inspect.isclass(c) and issubclass(c, Model) and c.__module__ == mod)

    return [("toolbox.stack.model", fn) if block_method(mod, fn) else (mod, fn) for mod, fn in visits]


@pytest.mark.parametrize("stack", ["cpu", "gfx1151-rocm10.0"])
def test_build_visits_each_module_once(stack):
    rc, visits = walk(["build", "--stack", stack, "--dry-run", "--engine", "docker", "--allow-unverified"])
    assert rc == 0
    path = stays(model_visits_as_data(visits))
    again = {m: n for m, n in collections.Counter(path).items() if n > 1 and m not in DATA}
    assert not again, f"modules the walk enters more than once: {again}\n" + " -> ".join(path)
    # the data path, in its order: arguments -> stack -> lock -> pins -> render -> engine
    order = [m for m in ("toolbox.commands.build", "toolbox.stack.load", "toolbox.stack.source", "toolbox.stack.python_lock",
                         "toolbox.rendering", "toolbox.components", "toolbox.engines.docker") if m in path]
    assert order == sorted(order, key=path.index) and len(order) == 7, path


def test_the_walk_sees_a_module_entered_twice(monkeypatch):
    # A check that cannot fail proves nothing: render asking the components a second time is found.
    from toolbox import components, rendering

    parts = components.parts
    monkeypatch.setattr(rendering.components, "parts", lambda stack: (parts(stack), parts(stack))[1])
    rc, visits = walk(["build", "--stack", "cpu", "--dry-run", "--engine", "docker"])
    assert rc == 0
    counts = collections.Counter(stays(model_visits_as_data(visits)))
    assert counts["toolbox.components.base"] == 2, counts
