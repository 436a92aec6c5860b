"""The net of tests/fuzz/conftest.py holds: an exception no check foresaw, in either CLI, fails
the test instead of becoming an "internal error" line that a suite allowing exit 1 would pass."""

from __future__ import annotations

import pytest

InternalError = AssertionError  # conftest.py's InternalError is one (not imported: tests/*/conftest.py share a name)


def test_an_internal_error_of_a_training_command_fails_the_fuzz_test(monkeypatch):
    from toolbox_train.commands import finetune

    def boom(*a, **kw):
        raise KeyError("a bug")

    monkeypatch.setattr(finetune, "run", boom)
    with pytest.raises(InternalError, match="finetune: internal error: KeyError") as e:
        finetune.main(["--config", "x.yaml"])
    assert isinstance(e.value.__cause__, KeyError)


def test_an_internal_error_of_the_host_cli_fails_the_fuzz_test(monkeypatch):
    import toolbox.cli as host

    def boom(argv):
        raise ZeroDivisionError("a bug")

    monkeypatch.setattr(host, "build_parser", boom)
    with pytest.raises(InternalError, match="toolbox: internal error: ZeroDivisionError"):
        host.main(["stacks"])


def test_faults_and_bad_input_still_pass_through(monkeypatch, capsys):
    from toolbox_train.contract import UserError
    from toolbox_train.commands import finetune

    for exc, code in ((UserError("train.yaml:3: bad"), 2), (OSError(28, "No space left on device", "/x"), 1)):
        def fail(*a, _exc=exc, **kw):
            raise _exc

        monkeypatch.setattr(finetune, "run", fail)
        assert finetune.main(["--config", "x.yaml"]) == code
        assert "internal error" not in capsys.readouterr().err
