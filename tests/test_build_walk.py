"""The walk of `toolbox build`'s inputs (issue 34): one stay per module where the data allows it.

tests/helpers/walk.py traces which host modules the parsed arguments, and what each step returns
from them, pass through. Before: the Python lock was found and read again by every component hook
that needed it (stack.python_lock entered 3-4 times, components.torch/hf/unsloth 7-19 times each,
77-105 stays a build), and render asked the components twice. Now the lock is read once when the
stack is resolved (`stack.python_lock`) and render asks each component once (`components.parts`).
The Stack's and the stack model's own methods (stack.resolved, stack.model, and the methods of
the blocks each component declares, e.g. `Base.ref`) are the data itself, consulted where it is
used; every other module is one stay. And the stack is resolved once per build (issue 45: a build
with first-use pins resolved it again in `with_pins`): its lock read, its pins collected and their
digest computed once each.
"""

from __future__ import annotations

import collections

import pytest

from helpers.walk import count_calls, stays, walk

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


def count_resolves(monkeypatch, argv: list[str]) -> tuple[int, collections.Counter]:
    """(exit code, how often each step of resolving a stack ran) for `toolbox ARGV`, in this process:
    its Python lock read (python_lock.state), its components' pins collected (components.pins)
    and their digest computed (digest.compute)."""
    from toolbox import cli, components
    from toolbox.stack import digest, python_lock

    seen = count_calls(monkeypatch, (python_lock, "state"), (components, "pins"), (digest, "compute"))
    return cli.main(argv), seen


@pytest.fixture()
def base_pinned(tmp_path, monkeypatch):
    """gfx1151-rocm10.0 (its base digest unpinned) with the digest in the user's pins file: a
    `build --frozen` takes it as a first-use pin (the path that resolved the stack twice), offline."""
    from toolbox.stack import pinning
    from toolbox.stack.load import load_stack

    monkeypatch.setenv("TOOLBOX_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setenv("TOOLBOX_CACHE_DIR", str(tmp_path / "cache"))
    image = load_stack("gfx1151-rocm10.0").model.base.image
    pinning.PinsFile().record("images", image, "the test's", digest="sha256:" + "a" * 64)
    return ["build", "--stack", "gfx1151-rocm10.0", "--frozen", "--dry-run", "--engine", "docker",
            "--context", str(tmp_path / "ctx")]


def test_build_resolves_the_stack_once(base_pinned, tmp_path, monkeypatch, capsys):
    rc, seen = count_resolves(monkeypatch, base_pinned)
    assert rc == 0, capsys.readouterr().err
    assert "base.digest: sha256:" + "a" * 64 in (tmp_path / "ctx" / "stack.lock.yaml").read_text()  # pinned
    assert seen == {"state": 1, "pins": 1, "compute": 1}, seen


def test_the_count_sees_a_second_resolve(base_pinned, monkeypatch, capsys):
    # A check that cannot fail proves nothing: the stack resolved again after loading (as with_pins
    # did) is counted.
    from toolbox.stack import load

    real = load.load_stack
    monkeypatch.setattr(load, "load_stack", lambda *a, **kw: load.with_pins(real(*a, **kw), []))
    rc, seen = count_resolves(monkeypatch, base_pinned)
    assert rc == 0, capsys.readouterr().err
    assert seen["pins"] == 2 and seen["compute"] == 2, seen


def test_the_first_use_pins_keep_the_python_lock_state(base_pinned):
    # The one resolve keeps the Python lock state it read before the first-use pins were applied:
    # a pin is a hash, a digest or a commit, none of what the lock is made from. Read afresh, the
    # pinned stack's lock state is the same, for a stack whose first use pins the base digest, and
    # for one that pins torch.wheels (10.1: its whole ROCm set by URL, hashes taken on first use).
    from toolbox.stack import pinning, python_lock
    from toolbox.stack.load import load_stack

    stack = load_stack("gfx1151-rocm10.0", first_use=lambda s: pinning.first_use_pins(s, frozen=True))
    assert stack.model.base.digest == "sha256:" + "a" * 64
    assert python_lock.state(stack) == stack.python_lock and stack.python_lock.whole is not None
    pinned = load_stack("gfx1151-rocm10.1", first_use=lambda s: [
        pinning.PinUpdate(("torch", "wheels", n), f"{ref.partition('#')[0]}#sha256={'b' * 64}")
        for n, ref in sorted(s.model.torch.wheels.items())])
    assert all(ref.endswith("#sha256=" + "b" * 64) for ref in pinned.model.torch.wheels.values())
    assert python_lock.state(pinned) == pinned.python_lock
