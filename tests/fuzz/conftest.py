"""Every fuzz suite here: an "internal error" is a bug. Whatever the suite asserts about exit
codes (some allow 1, a fault), an exception that reaches either CLI's last line of defence
(toolbox's `main`, the training commands' guard) fails the example there, with its traceback,
and Hypothesis shrinks it: the suites need not each look for the words in what they capture."""

from __future__ import annotations

import pytest


class InternalError(AssertionError):
    """An exception no check foresaw reached a CLI's guard."""


def _fail(line: str, exc: BaseException):
    raise InternalError(f"{line}\n(an 'internal error' is a bug: a check or a fault's message is missing)") from exc


@pytest.fixture(autouse=True)
def no_internal_error(monkeypatch):
    import toolbox.cli as host
    import toolbox_train.contract as train

    def train_line(prog, exc, _line=train.internal_error_line):
        _fail(_line(prog, exc), exc)

    def host_line(exc, command, _line=host._error_line):
        line, code = _line(exc, command)
        if "internal error" in line:
            _fail(line, exc)
        return line, code

    monkeypatch.setattr(train, "internal_error_line", train_line)
    monkeypatch.setattr(host, "_error_line", host_line)
