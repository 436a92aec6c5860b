"""The one CLI contract of the training commands (finetune, launch, export-model, evaluate, bench,
rccl-check) and of the host's `toolbox` (toolbox/errors.py re-exports it): the errors they raise,
`--debug`, the machine's faults, secrets masked in every line, and what happens to an exception
that reaches the entry point: one line and a non-zero exit (UserError 2, ToolError 1, interrupt
130, SIGTERM 143); the traceback only with --debug or TOOLBOX_DEBUG=1."""

from __future__ import annotations

import argparse
import errno
import os
import re
import signal
import sys
import threading
import traceback
from pathlib import Path
from typing import Callable, Sequence


class UserError(Exception):
    """Bad input: the message names the file, field or line; exit code 2."""

    exit_code = 2


class ToolError(Exception):
    """Something outside the user's input failed; exit code 1."""

    exit_code = 1


class Terminated(KeyboardInterrupt):
    """SIGTERM (a scheduler, `kill`, `podman stop`), raised in the main thread as SIGINT raises
    KeyboardInterrupt, and a KeyboardInterrupt: every cleanup written for Ctrl-C runs for it too
    (`finally` blocks, temp files, the nodes of a cluster run stopped); a handler that must tell
    the two apart catches Terminated first. Exit code 143 (128 + 15)."""

    exit_code = 128 + signal.SIGTERM


def _raise_terminated(signum, frame):
    raise Terminated()


def first_line(exc: BaseException, limit: int = 300) -> str:
    """The first line of an exception's message (libraries' messages run to many lines), or its type."""
    text = str(exc).strip()
    return (text.splitlines()[0] if text else type(exc).__name__)[:limit]


# A failed write or read the machine caused (not the input, not a bug): a full disk, a quota, a
# file system that went read-only or failed. The one list: disk.write_error and the guards use it.
FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)
MACHINE_ERRNOS = (*FULL_ERRNOS, errno.EROFS, errno.EIO)
_FULL = tuple((code, os.strerror(code)) for code in FULL_ERRNOS)


def disk_full(exc: BaseException, where: Path | None = None) -> str | None:
    """The cause's words ('No space left on device', 'Disk quota exceeded') when the failed write
    `exc` (or one it came from) met a full disk, else None. safetensors says it in its text ("os
    error 28"); torch.save only "unexpected pos" or "file write failed": then the file system of
    `where` with (almost) nothing left says it."""
    seen: set[int] = set()
    e: BaseException | None = exc
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        for code, words in _FULL:
            if (isinstance(e, OSError) and e.errno == code) or words in str(e) or f"os error {code})" in str(e):
                return words
        e = e.__cause__ or e.__context__
    if where is not None:
        try:
            st = os.statvfs(where)
        except OSError:
            return None
        if st.f_bavail * st.f_frsize < 2**20:  # a write that fails with under 1 MiB left
            return f"{os.strerror(errno.ENOSPC)} ({st.f_bavail * st.f_frsize // 1024} KiB free)"
    return None


# The environment's secrets the trackers and the hub read; their values never reach a printed line.
SECRET_ENV = ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "WANDB_API_KEY", "MLFLOW_TRACKING_TOKEN",
              "MLFLOW_TRACKING_PASSWORD")
_URL_PASSWORD = re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://[^\s/:@]*):[^\s/@]*@")


def mask_secrets(text: str) -> str:
    """`text` with the password of every URL (`https://user:***@host/`) and the value of every
    SECRET_ENV variable set here (`***`) masked: the one rule for every line an error prints."""
    text = _URL_PASSWORD.sub(r"\1:***@", str(text))
    for name in SECRET_ENV:
        value = os.environ.get(name, "")
        if len(value) >= 4:  # a value of one or two characters would mask half the line
            text = text.replace(value, "***")
    return text


def machine_fault(exc: BaseException) -> str | None:
    """'PATH: No space left on device' for an OSError of MACHINE_ERRNOS, or 'disk full: ...' for a
    library's error that says so in its text (safetensors: "os error 28"); else None."""
    if isinstance(exc, OSError) and exc.errno in MACHINE_ERRNOS:
        where = f"{exc.filename}: " if exc.filename else ""
        return f"{where}{exc.strerror or os.strerror(exc.errno)}"
    full = disk_full(exc)
    return f"disk full ({full}): {type(exc).__name__}: {first_line(exc)}" if full else None


DEBUG_HELP = "show the traceback of an error (or TOOLBOX_DEBUG=1)"


class _Parser(argparse.ArgumentParser):
    """argparse's usage errors as one line naming the flag (exit 2 through the guard), not the
    usage text and a line; subcommands' parsers are of this class too (add_subparsers makes them
    of the parent's)."""

    def error(self, message: str):
        raise UserError(f"{message} (`{self.prog} --help` shows the usage)")


class _Renamed(argparse.Action):
    """An old flag name, still taken: it sets the new flag's value and says the new name on stderr."""

    def __init__(self, option_strings, dest, new: str, **kw):
        self.new = new
        super().__init__(option_strings, dest, **kw)

    def __call__(self, parser, namespace, values, option_string=None):
        print(f"{parser.prog}: {option_string} is now {self.new}", file=sys.stderr)
        setattr(namespace, self.dest, values)


def renamed(parser: argparse.ArgumentParser, old: str, new: str) -> None:
    """Keep `old` working for the flag `new` (already added to parser), hidden from --help: the same
    value, type and choices; each use prints one line naming the new flag (one name per concept)."""
    action = next(a for a in parser._actions if new in a.option_strings)
    parser.add_argument(old, dest=action.dest, type=action.type, choices=action.choices, metavar=action.metavar,
                        action=_Renamed, new=new, default=argparse.SUPPRESS, help=argparse.SUPPRESS)



def new_names(parser: argparse.ArgumentParser, argv: list[str]) -> list[str]:
    """argv with every renamed flag under its new name: for a command that hands its own argv to
    the processes it starts, so the one line about the old name is printed once, not per process."""
    old = {s: a.new for a in parser._actions if isinstance(a, _Renamed) for s in a.option_strings}
    out = []
    for word in argv:
        flag, eq, value = word.partition("=")
        out.append(old[flag] + eq + value if flag in old else word)
    return out

def command_parser(prog: str, description: str | None = None, **kw) -> argparse.ArgumentParser:
    """The parser of a training command, `--debug` included: the command adds only its own options."""
    parser = _Parser(prog=prog, description=description, **kw)
    parser.add_argument("--debug", action="store_true", help=DEBUG_HELP)
    return parser


def run_command(prog: str, body: Callable[[list[str]], int | None], argv: Sequence[str] | None = None,
                interrupted: str = "interrupted") -> int:
    """A training command's `main`: `body(argv)` (which parses argv with its command_parser) under the
    guard. --debug counts before a `--` only: what follows is another command's (`launch -- finetune`)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    own = argv[:argv.index("--")] if "--" in argv else argv
    return _guarded(prog, lambda: body(argv), os.environ.get("TOOLBOX_DEBUG") == "1" or "--debug" in own,
                   interrupted)


def _quiet_stdout() -> None:
    # Keep Python's own flush at exit from failing on a pipe whose reader is gone.
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


def internal_error_line(prog: str, exc: BaseException) -> str:
    """The line of an exception no check foresaw: a bug (tests/fuzz fails on any)."""
    what = f"{type(exc).__name__}: {first_line(exc, 500)}" if str(exc).strip() else type(exc).__name__
    return f"{prog}: internal error: {what} (run with --debug or TOOLBOX_DEBUG=1 for the traceback)"


def _say(line: str) -> None:
    print(mask_secrets(line), file=sys.stderr)


def _guarded(prog: str, body: Callable[[], int | None], debug: bool, interrupted: str = "interrupted") -> int:
    """Run `body` (argument parsing included); turn what escapes it into one line and an exit code:
    UserError 2, ToolError 1, KeyboardInterrupt 130, SIGTERM 143, anything else 1 (the traceback only
    with debug)."""
    old = None
    if threading.current_thread() is threading.main_thread():
        old = signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        code = int(body() or 0)
        sys.stdout.flush()
        return code
    except Terminated as exc:
        _say(f"{prog}: terminated (SIGTERM){': ' + str(exc) if str(exc) else ''}")
        return exc.exit_code
    except (UserError, ToolError) as exc:
        if debug:
            traceback.print_exc()
        _say(f"{prog}: error: {exc}")
        return exc.exit_code
    except KeyboardInterrupt:
        _say(f"{prog}: {interrupted}")
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
        fault = machine_fault(exc)
        if debug:
            traceback.print_exc()
        if fault:  # the machine's, not a bug: one line and exit 1 (the traceback only with debug)
            _say(f"{prog}: error: {fault}")
        elif not debug:
            _say(internal_error_line(prog, exc))
        return 1
    finally:
        if old is not None:
            signal.signal(signal.SIGTERM, old)
