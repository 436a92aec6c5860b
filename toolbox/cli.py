"""The `toolbox` command line.

Each module in toolbox/commands/ contributes its subcommands through `register(subparsers)`.
Only the module of the command being run is imported, so one command's optional dependency
(torch for `bench`, ...) never breaks another; COMMANDS lists them for `toolbox --help`
(tests/test_cli.py checks it against what each module registers).

Every error reaching main() becomes one line and a non-zero exit: UserError 2, anything
else 1; `--debug` (or TOOLBOX_DEBUG=1) shows the traceback instead.
"""

from __future__ import annotations

import argparse
import importlib
import os
import signal
import sys
import threading
import traceback

from toolbox import __version__
from toolbox.errors import Terminated, ToolError, UserError, mask_secrets

# command: (module in toolbox/commands/, its line in `toolbox --help`)
COMMANDS = {
    "bench": ("bench", "benchmark finetune against bare loops and TRL (results.json, table, chart)"),
    "build": ("build", "render a stack and build its image (podman or Docker)"),
    "bump": ("bump", "resolve a new release of a component and rewrite the stack's pins"),
    "cluster": ("cluster", "multi-node training over SSH (launch, check, ray)"),
    "context": ("render", "write a stack's whole build context into a new folder"),
    "create": ("create", "create a long-lived toolbx or distrobox container of a stack's image"),
    "doctor": ("doctor", "check engine, GPU, image labels vs stack pins; in-container probe"),
    "lint": ("lint", "render stacks and check them with hadolint and a Dockerfile parser"),
    "lock": ("lock", "resolve a stack's whole Python set into its Python lock (uv, every file hashed)"),
    "patches": ("patches", "patch series (RCCL for gfx1151)"),
    "render": ("render", "render a stack's Dockerfile"),
    "run": ("run", "run CMD in a stack's image (GPU devices, mounts, env by name)"),
    "stacks": ("stacks", "list the shipped stacks with their base and key pins"),
}
# What a command's missing module is installed with.
EXTRAS = {"torch": "train", "transformers": "train", "trl": "train", "peft": "train",
          "accelerate": "train", "datasets": "train", "toolbox_train": "train", "matplotlib": "bench",
          "dockerfile": "test"}


def _command_in(argv: list[str]) -> str | None:
    """The subcommand argv names: its first word that is not an option."""
    return next((a for a in argv if not a.startswith("-")), None)


def _missing(name: str, exc: ImportError) -> ToolError:
    mod = (exc.name or "").split(".")[0]
    extra = EXTRAS.get(mod)
    how = f"pip install 'strix-toolbox[{extra}]'" if extra else f"install the Python package {mod!r}"
    return ToolError(f"`toolbox {name}` needs {mod!r}, which is not installed here: {how}")


class _Parser(argparse.ArgumentParser):
    """argparse's usage errors as one line naming the flag (exit 2), not usage text and a line;
    subcommands' parsers are of this class too (add_subparsers makes them of the parent's)."""

    def error(self, message: str):
        name = self.prog.removeprefix("toolbox").strip()
        raise UserError(f"{name + ': ' if name else ''}{message} (`{self.prog} --help` shows the usage)")

    def _get_values(self, action, arg_strings):
        # `--set=--`: argparse drops the "--" and hands the command an empty list as the value
        if action.option_strings and action.nargs is None and arg_strings == ["--"]:
            value = self._get_value(action, "--")
            self._check_value(action, value)
            return value
        return super()._get_values(action, arg_strings)


def build_parser(argv: list[str] | None = None) -> argparse.ArgumentParser:
    """The parser with the full arguments of the command argv names (None: of every command)."""
    parser = _Parser(
        prog="toolbox",
        description="Build pinned LLM fine-tuning images and run training in them. "
        "(Not Fedora's `toolbox`: this one is `python -m toolbox`, see README.)",
    )
    parser.add_argument("--version", action="version", version=f"toolbox {__version__}")
    parser.add_argument("--debug", action="store_true", help="show the traceback of an error (or TOOLBOX_DEBUG=1)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    wanted = COMMANDS if argv is None else [c for c in [_command_in(argv)] if c in COMMANDS]
    for name in wanted:
        if name in sub.choices:
            continue
        try:
            importlib.import_module(f"toolbox.commands.{COMMANDS[name][0]}").register(sub)
        except ImportError as exc:  # ModuleNotFoundError, or a name its package could not import
            raise _missing(name, exc) from exc
    for name, (_, help_line) in sorted(COMMANDS.items()):
        if name not in sub.choices:
            sub.add_parser(name, help=help_line)  # listed in --help; its module loads when it runs
    return parser


def one_line(text: str, limit: int = 2000) -> str:
    """A message of several lines (a library's, a tool's) as one: its lines joined with "; "."""
    text = "; ".join(line.strip() for line in str(text).splitlines() if line.strip())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _error_line(exc: BaseException, command: str | None) -> tuple[str, int]:
    """The one line and the exit code an exception that reached main() becomes."""
    if isinstance(exc, (UserError, ToolError)):
        return f"toolbox: error: {one_line(exc)}", exc.exit_code
    if isinstance(exc, ImportError) and (exc.name or "").split(".")[0] in EXTRAS:
        return f"toolbox: error: {one_line(_missing(command or '', exc))}", 1
    if isinstance(exc, OSError) and exc.strerror:  # a fault of the machine (disk full, ...), not a bug
        where = f"{exc.filename}: " if exc.filename else ""
        return f"toolbox: error: {one_line(where + exc.strerror)}", 1
    return f"toolbox: internal error: {type(exc).__name__}: {one_line(exc)} (run with --debug for the traceback)", 1


def _on_sigterm(signum, frame):
    raise Terminated()


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    command = _command_in(argv)
    debug = os.environ.get("TOOLBOX_DEBUG") == "1" or "--debug" in argv[: argv.index(command) if command else None]
    old_term = None
    if threading.current_thread() is threading.main_thread():
        old_term = signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        parser = build_parser(argv)
        args = parser.parse_args(argv)
        if not getattr(args, "func", None):
            parser.print_help(sys.stderr)
            return 2
        code = int(args.func(args) or 0)
        sys.stdout.flush()
        return code
    except Terminated:
        print("toolbox: terminated (SIGTERM)", file=sys.stderr)
        return 143
    except KeyboardInterrupt:
        print("toolbox: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # `toolbox stacks | head -1`: the reader left; say nothing, and keep Python's own
        # flush at exit from failing on the closed pipe.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except SystemExit:
        # argparse's --help/--version print, then exit: the same closed pipe shows at the flush.
        try:
            sys.stdout.flush()
        except BrokenPipeError:
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        raise
    except Exception as exc:  # noqa: BLE001 (the CLI's last line of defence: one line, never a traceback)
        line, code = _error_line(exc, command)
        if debug:
            traceback.print_exc()
        print(mask_secrets(line), file=sys.stderr)
        return code
    finally:
        if old_term is not None:
            signal.signal(signal.SIGTERM, old_term)


if __name__ == "__main__":
    raise SystemExit(main())
