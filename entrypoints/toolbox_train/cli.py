"""The one CLI contract of the training commands (finetune, launch, export-model, evaluate, bench,
rccl-check): the errors they raise, `--debug`, and what happens to an exception that reaches
the entry point: one line and a non-zero exit (UserError 2, ToolError 1, interrupt 130); the
traceback only with --debug or TOOLBOX_DEBUG=1. The same contract as the host's `toolbox` CLI
(toolbox/cli.py), which this package cannot import."""

from __future__ import annotations

import argparse
import os
import sys
import traceback
from typing import Callable, Sequence


class UserError(Exception):
    """Bad input: the message names the file, field or line; exit code 2."""

    exit_code = 2


class ToolError(Exception):
    """Something outside the user's input failed; exit code 1."""

    exit_code = 1


def first_line(exc: BaseException, limit: int = 300) -> str:
    """The first line of an exception's message (libraries' messages run to many lines), or its type."""
    text = str(exc).strip()
    return (text.splitlines()[0] if text else type(exc).__name__)[:limit]


DEBUG_HELP = "show the traceback of an error (or TOOLBOX_DEBUG=1)"


def add_debug(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    parser.add_argument("--debug", action="store_true", help=DEBUG_HELP)
    return parser


def debug_wanted(argv: Sequence[str]) -> bool:
    return os.environ.get("TOOLBOX_DEBUG") == "1" or "--debug" in argv


def _quiet_stdout() -> None:
    # Keep Python's own flush at exit from failing on a pipe whose reader is gone.
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


def guarded(prog: str, body: Callable[[], int | None], debug: bool) -> int:
    """Run `body` (argument parsing included); turn what escapes it into a message and an exit code."""
    try:
        code = int(body() or 0)
        sys.stdout.flush()
        return code
    except (UserError, ToolError) as exc:
        if debug:
            traceback.print_exc()
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `bench list | head -1`: the reader left; say nothing
        _quiet_stdout()
        return 0
    except SystemExit:  # argparse's --help and usage errors: a closed pipe shows at the flush
        try:
            sys.stdout.flush()
        except BrokenPipeError:
            _quiet_stdout()
        raise
    except Exception as exc:  # noqa: BLE001 (the entry point's last line of defence)
        if debug:
            traceback.print_exc()
        else:
            what = f"{type(exc).__name__}: {first_line(exc, 500)}" if str(exc).strip() else type(exc).__name__
            print(f"{prog}: internal error: {what} "
                  "(run with --debug or TOOLBOX_DEBUG=1 for the traceback)", file=sys.stderr)
        return 1
