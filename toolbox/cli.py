"""The `toolbox` command line.

Each module in toolbox/commands/ contributes its subcommands through
`register(subparsers)`, so a command lives in one file and this one never grows.
"""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys

from toolbox import __version__, commands
from toolbox.errors import ToolError, UserError


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="toolbox",
        description="Build pinned LLM fine-tuning images and run training in them. "
        "(Not Fedora's `toolbox`: this one is `python -m toolbox`, see README.)",
    )
    parser.add_argument("--version", action="version", version=f"toolbox {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for info in sorted(pkgutil.iter_modules(commands.__path__), key=lambda m: m.name):
        module = importlib.import_module(f"toolbox.commands.{info.name}")
        module.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help(sys.stderr)
        return 2
    try:
        return int(args.func(args) or 0)
    except (UserError, ToolError) as exc:
        print(f"toolbox: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("toolbox: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
