"""The host options several commands share, declared once: `--stack` and `--set`.

Each command passes only what its option means for it (`what`: a few words after the common
text); the name, metavar, destination and action stay the same everywhere. Importing this
module imports no stack code (cli.py builds every parser, whatever command runs).
"""

from __future__ import annotations

import argparse

from toolbox.paths import DEFAULT_STACK


def add_stack(p: argparse.ArgumentParser, what: str = "default {default}") -> None:
    """`--stack NAME|PATH` into args.stack (None: the command's default, named in `what`, where
    {default} stands for DEFAULT_STACK)."""
    p.add_argument("--stack", metavar="NAME|PATH", default=None,
                   help=f"shipped stack name or path to a stack YAML ({what.format(default=DEFAULT_STACK)})")


def add_set(p: argparse.ArgumentParser, what: str = "validated like the file") -> None:
    """`--set KEY.PATH=VALUE` (repeatable) into args.overrides."""
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY.PATH=VALUE",
                   help=f"override a stack field, e.g. --set hf.peft=0.21.1 (repeatable; {what})")


def add_stack_and_set(p: argparse.ArgumentParser, set_what: str = "validated like the file") -> None:
    add_stack(p)
    add_set(p, set_what)
