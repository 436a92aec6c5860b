"""The sandbox for code a model writes, and GRPO's built-in `python_tests` reward over it. A piece
of Python runs with a row's tests in a separate process under bubblewrap (new user, network, mount,
pid, IPC and UTS namespaces), a fresh size-capped tmpfs its only writable folder, rlimits on CPU,
memory, processes, file size and open files, its output capped, a wall-clock timeout that takes the
whole namespace down, and an environment built from a fixed allow-list. A run always ends in a
`Result` (passed, failed, error, exited, timeout, killed, output_limit, sandbox_error) with a score;
it never raises into or hangs its caller. What each limit rests on: docs/preference.md,
"Sandboxed code rewards (GRPO)"."""

from toolbox_train.sandbox.jail import Result, probe, run
from toolbox_train.sandbox.limits import Limits
from toolbox_train.sandbox.reward import extract_code, python_tests

__all__ = ["Limits", "Result", "extract_code", "probe", "python_tests", "run"]
