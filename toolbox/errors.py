"""Errors the CLI turns into a message and an exit code instead of a traceback."""


class UserError(Exception):
    """Bad input: a message naming the file, field or line; exit code 2."""

    exit_code = 2


class ToolError(Exception):
    """Something outside the user's input failed (an engine, a build); exit code 1."""

    exit_code = 1


class Terminated(KeyboardInterrupt):
    """SIGTERM (a scheduler, `kill`, `podman stop` of a container toolbox runs in), raised in the
    main thread like Ctrl-C, so that cleanup runs: temporary files go, outputs stay whole, the
    nodes of a cluster run are stopped; exit code 143."""
