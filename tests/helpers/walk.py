"""The walk of a command's inputs through the host's modules (issue 34: `toolbox build`'s went from
17 stays in 9 modules to 29 in 12, stack.python_lock entered 5 times).

Traced with sys.setprofile while the command runs in this process: a call belongs to the walk when
one of its arguments is the parsed argparse Namespace, one of that Namespace's values, or an object
an earlier call of the walk returned (the Stack, the pins, the context folder, ...). A *visit* of a
module is such a call made from another of the project's modules: dunder methods (the Stack's
attribute access, constructors) and callbacks a library makes (jinja's filters, pydantic's
validators) are not visits, nor is a closure the walk made, called back (data.dataset calling
preflight's row check). Strings are names, not followed (a training command's paths too).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import io
import sys
from pathlib import PurePath


def walk(argv: list[str], prefix: str = "toolbox.", main=None,
         entry: tuple[str, ...] = ("toolbox.cli", "toolbox.__main__")) -> tuple[int, list[tuple[str, str]]]:
    """(exit code, [(module, function), ...] of each visit, in order) of `toolbox ARGV`, or of
    `main(ARGV)` (a training command: `prefix` "toolbox_train.", `entry` the modules of its CLI
    contract, which are the door and not the walk)."""
    cli_main = main is None
    if cli_main:
        from toolbox import cli

        main = cli.main

    tracked: set[int] = set()
    keep: list = []  # tracked objects stay alive, so their ids stay theirs
    in_walk: set[int] = set()
    visits: list[tuple[str, str]] = []

    # A training command's walk follows data, not names: a str or Path (a file, a folder) is not followed
    # there, what is read from it is. `toolbox build`'s walk keeps following the context folder it made.
    leaves = () if cli_main else (PurePath,)

    def track(obj) -> None:
        if obj is not None and not isinstance(obj, (bool, int, float, *leaves)):
            tracked.add(id(obj))
            keep.append(obj)

    def prof(frame, event, arg):
        mod = frame.f_globals.get("__name__", "")
        if not mod.startswith(prefix) or mod in entry:
            return
        code = frame.f_code
        if event == "call":
            names = code.co_varnames[:code.co_argcount + code.co_kwonlyargcount]
            vals = [frame.f_locals.get(n) for n in names]
            if not tracked:
                ns = next((v for v in vals if isinstance(v, argparse.Namespace)), None)
                if ns is None:
                    return
                for v in (ns, *vars(ns).values()):
                    track(v)
            if not any(id(v) in tracked for v in vals):
                return
            in_walk.add(id(frame))
            caller = frame.f_back.f_globals.get("__name__", "") if frame.f_back else ""
            # a closure called back (`<locals>` in its name) belongs to the stay of the function that made it
            if caller != mod and caller.startswith(prefix) and "<locals>" not in code.co_qualname and not (
                    code.co_name.startswith("__") and code.co_name.endswith("__")):
                visits.append((mod, code.co_name))
        elif event == "return" and id(frame) in in_walk:
            in_walk.discard(id(frame))
            if not isinstance(arg, str):
                track(arg)
                if isinstance(arg, tuple) and not cli_main:  # (cfg, base, where), (run, train, eval): data
                    for v in arg:
                        if not isinstance(v, str):
                            track(v)

    if not cli_main:  # no function is given the Namespace: the walk starts at the arguments themselves
        for v in (argv, *argv):  # the config's path included (a name, but the walk's start)
            tracked.add(id(v))
            keep.append(v)
    sys.setprofile(prof)
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            rc = main(argv)
    except SystemExit as exc:
        rc = exc.code
    finally:
        sys.setprofile(None)
    return rc, visits


def counts(visits: list[tuple[str, str]]) -> dict[str, int]:
    return dict(collections.Counter(m for m, _ in visits))


def stays(visits: list[tuple[str, str]]) -> list[str]:
    """The modules of the walk in order, consecutive visits of one module as one stay."""
    out: list[str] = []
    for mod, _ in visits:
        if not out or out[-1] != mod:
            out.append(mod)
    return out


def count_calls(monkeypatch, *targets) -> collections.Counter:
    """Each (module, name) in `targets` replaced (monkeypatch) by a wrapper counting its calls under
    `name` in the returned Counter, then calling the real one."""
    seen: collections.Counter = collections.Counter()

    def counted(module, name):
        real = getattr(module, name)

        def call(*a, **kw):
            seen[name] += 1
            return real(*a, **kw)

        monkeypatch.setattr(module, name, call)

    for module, name in targets:
        counted(module, name)
    return seen
