"""Errors the entrypoints turn into a message and an exit code (same codes as `toolbox`)."""


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
