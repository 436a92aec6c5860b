"""Errors the entrypoints turn into a message and an exit code (same codes as `toolbox`)."""


class UserError(Exception):
    """Bad input: the message names the file, field or line; exit code 2."""

    exit_code = 2


class ToolError(Exception):
    """Something outside the user's input failed; exit code 1."""

    exit_code = 1
