"""The sandbox for code a model writes (issue 46): hostile completions run in real bubblewrap
sandboxes, each ends in a scored Result, the caller alive; nothing outside the sandbox's folder is
written or read, no connection leaves it, no secret of the caller's environment reaches it. And the
`python_tests` reward through GRPO's reward resolution, as finetune resolves and tries it."""

from __future__ import annotations

import os
import socket
import sys
import uuid
from pathlib import Path

import pytest

from toolbox_train import sandbox
from toolbox_train.sandbox import Limits, jail

# Short limits keep the file fast; the defaults are docs/preference.md's.
FAST = dict(timeout=3, cpu_seconds=1, memory_mb=256, processes=8, output_kb=16)


@pytest.fixture(scope="module")
def limits() -> Limits:
    """The trainer's own interpreter when the sandbox's user can reach it; else the system's (here
    the venv's Python lives under /root, which nobody, the user a root caller runs the sandbox as,
    cannot enter). A sandbox that runs neither way fails the tests: it is what they test."""
    tried = []
    for python in (None, "/usr/bin/python3"):
        lim = Limits(**FAST, python=python)
        why = sandbox.probe(lim)
        if why is None:
            return lim
        tried.append(f"{python or sys.executable}: {why}")
    pytest.fail("the sandbox does not run here: " + "; ".join(tried))


def _alive(marker: str) -> list[str]:
    """Processes whose name (comm) is `marker`: the code's processes, should any outlive the run."""
    found = []
    for comm in Path("/proc").glob("[0-9]*/comm"):
        try:
            if comm.read_text().strip() == marker:
                found.append(comm.parent.name)
        except OSError:
            pass
    return found


def test_a_correct_solution_scores_1_a_wrong_one_0_a_half_right_one_half(limits):
    tests = ["assert add(1, 2) == 3", "assert add(-1, 1) == 0"]
    right = sandbox.run("def add(a, b):\n    return a + b\n", tests, limits)
    wrong = sandbox.run("def add(a, b):\n    return a - b\n", tests, limits)
    half = sandbox.run("def add(a, b):\n    return 3\n", tests, limits)
    assert (right.status, right.score) == ("passed", 1.0)
    assert (wrong.status, wrong.score) == ("failed", 0.0)
    assert (half.status, half.passed, half.score) == ("failed", 1, 0.5)
    broken = sandbox.run("def add(a, b) return a", tests, limits)
    assert (broken.status, broken.detail, broken.score) == ("error", "SyntaxError", 0.0)


def test_a_fork_bomb_is_held_to_the_process_limit_and_dies_with_the_sandbox(limits):
    marker = "bomb" + uuid.uuid4().hex[:8]
    code = (f"import ctypes, os, time\nctypes.CDLL(None).prctl(15, {marker.encode()!r}, 0, 0, 0)  # PR_SET_NAME\n"
            "while True:\n"
            "    try:\n"
            "        pid = os.fork()\n"
            "    except OSError:\n"
            "        time.sleep(60)  # hold the slot: only the wall clock ends this\n"
            "    else:\n"
            "        if pid == 0:\n"
            "            os.write(1, b'child\\n')\n")
    r = sandbox.run(code, ["assert True"], limits)
    assert r.status == "timeout" and r.score == 0.0
    children = r.output.split().count("child")
    assert 0 < children <= limits.processes, r.output[:200]  # bwrap's init and the harness hold 2 of them
    assert _alive(marker) == []


def test_an_infinite_loop_is_stopped_by_the_cpu_limit_or_the_clock(limits):
    r = sandbox.run("while True:\n    pass\n", ["assert True"], limits)
    assert r.score == 0.0
    assert (r.status, r.detail) == ("killed", "SIGXCPU") or r.status == "timeout", r


def test_a_10_gb_allocation_fails_inside(limits):
    r = sandbox.run("block = bytearray(10 * 2**30)\n", ["assert len(block) > 0"], limits)
    assert (r.status, r.detail, r.score) == ("error", "MemoryError", 0.0)


def test_a_connect_to_a_listening_port_on_this_machine_never_arrives(limits):
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        listener.setblocking(False)
        port = listener.getsockname()[1]
        code = ("import socket\n"
                "try:\n"
                f"    socket.create_connection(('127.0.0.1', {port}), timeout=2).close()\n"
                "    connected = True\n"
                "except OSError as exc:\n"
                "    connected = False\n"
                "    print(type(exc).__name__)\n")
        r = sandbox.run(code, ["assert connected"], limits)
        assert (r.status, r.score) == ("failed", 0.0), r
        with pytest.raises(BlockingIOError):
            listener.accept()
        # the same code here, outside the sandbox, does connect: the check above can fail
        scope: dict = {}
        exec(code, scope)
        assert scope["connected"]
        listener.accept()[0].close()


def test_nothing_outside_the_folder_is_written_or_read(limits, tmp_path):
    target = tmp_path / "escaped.txt"
    secret = tmp_path / "secret.txt"
    secret.write_text("the caller's file")
    beside = Path(sys.prefix) / f"escaped-{uuid.uuid4().hex[:8]}"  # a folder the sandbox sees, read-only
    code = ("import os\nescaped, seen = [], []\n"
            f"for path in ({str(target)!r}, {str(beside)!r}, '/escaped.txt', '/usr/escaped.txt'):\n"
            "    try:\n"
            "        open(path, 'w').write('x')\n"
            "        escaped.append(path)\n"
            "    except OSError:\n"
            "        pass\n"
            "try:\n"
            f"    seen.append(open({str(secret)!r}).read())\n"
            "except OSError:\n"
            "    pass\n")
    tests = ["assert escaped == []", "assert seen == []",
             # its own folder: the cwd, HOME, writable
             "assert os.getcwd() == os.environ['HOME'] == '/sandbox' and open('mine.txt', 'w').write('ok') == 2"]
    r = sandbox.run(code, tests, limits)
    assert (r.status, r.score) == ("passed", 1.0), r
    assert not target.exists() and not beside.exists() and not Path("/escaped.txt").exists()


def test_the_callers_secrets_are_not_in_the_sandboxs_environment(limits, monkeypatch):
    token = "hf_" + uuid.uuid4().hex
    for name in ("HF_TOKEN", "WANDB_API_KEY", "MY_SERVICE_SECRET", "HTTPS_PROXY"):
        monkeypatch.setenv(name, token)
    code = ("import os\nleaks = [k for k, v in os.environ.items() if v == %r]\n"
            "print(dict(os.environ))\n") % token
    r = sandbox.run(code, ["assert leaks == []", "assert 'HF_TOKEN' not in os.environ"], limits)
    assert (r.status, r.score) == ("passed", 1.0), r
    assert token not in r.output and "'HOME': '/sandbox'" in r.output  # what it printed is its environment


def test_no_user_namespace_inside_where_the_machine_lets_bwrap_forbid_it(limits):
    # unshare(CLONE_NEWUSER) from the code: refused under --disable-userns (this machine; not in a
    # podman container, whose read-only /proc/sys refuses the setting: docs/preference.md)
    test = "import ctypes\nassert ctypes.CDLL(None, use_errno=True).unshare(0x10000000) == -1"
    r = sandbox.run("", [test], limits)
    assert jail._no_nested_userns() == ("--disable-userns",)
    assert (r.status, r.score) == ("passed", 1.0), r


def test_a_gigabyte_of_output_is_cut_at_the_cap(limits):
    code = "import sys\nfor _ in range(2**14):\n    sys.stdout.write('x' * 65536)\n"  # 1 GiB
    r = sandbox.run(code, ["assert True"], limits)
    assert (r.status, r.score) == ("output_limit", 0.0)
    assert 0 < len(r.output) <= limits.output_kb * 1024


def test_a_sleep_past_the_timeout_is_killed_with_what_finished_counted(limits):
    r = sandbox.run("import time\n", ["assert True", "time.sleep(60)", "assert True"], limits)
    assert (r.status, r.passed, r.total) == ("timeout", 1, 3)


def test_the_code_cannot_report_a_pass_by_ending_the_process_or_forking(limits):
    exits = sandbox.run("import os\nos._exit(0)\n", ["assert True"], limits)
    assert (exits.status, exits.score) == ("exited", 0.0)
    raised = sandbox.run("raise SystemExit(0)\n", ["assert True"], limits)
    assert (raised.status, raised.score) == ("error", 0.0)
    forked = sandbox.run("import os\nos.fork()\n", ["assert 1 == 2", "assert True"], limits)
    assert (forked.status, forked.passed, forked.total) == ("failed", 1, 2)  # the child's lines not counted


def test_no_bwrap_is_a_sandbox_error_not_a_crash(limits, monkeypatch):
    monkeypatch.setattr(jail.shutil, "which", lambda name: None)
    r = sandbox.run("x = 1", ["assert x == 1"], limits)
    assert (r.status, r.score) == ("sandbox_error", 0.0) and "not installed" in r.detail
    assert "apt-get install bubblewrap" in sandbox.probe(limits)


def test_code_is_the_last_python_block_else_the_whole_text():
    assert sandbox.extract_code("first\n```python\nx = 1\n```\nthen\n```py\nx = 2\n```\n") == "x = 2\n"
    assert sandbox.extract_code([{"role": "assistant", "content": "```python\ny = 3\n```"}]) == "y = 3\n"
    assert sandbox.extract_code("z = 4") == "z = 4"


# ---- the reward through GRPO's reward resolution (planning/rewards.py), as finetune runs it ----

CODE_ROWS = [{"prompt": "Write add(a, b).", "tests": ["assert add(1, 2) == 3", "assert add(0, 0) == 0"]},
             {"prompt": "Write neg(x).", "tests": ["assert neg(2) == -2"]},
             {"prompt": "Write one().", "tests": "assert one() == 1"}]


def _config(rewards: list[dict]):
    from toolbox_train.config.schema import TrainConfig

    return TrainConfig.model_validate({"model": {"path": "m"}, "data": {"path": "d"}, "output": {"dir": "o"},
                                       "objective": "grpo", "grpo": {"rewards": rewards}})


def test_python_tests_resolves_and_scores_what_trl_passes_it(limits, tmp_path, tiny_model):
    from datasets import Dataset
    from transformers import AutoTokenizer, TrainerState

    from toolbox_train.planning import rewards

    cfg = _config([{"function": "python_tests", "sandbox": limits.model_dump(exclude_none=True)},
                   {"function": "length", "max_chars": 400, "weight": 0.1}])
    funcs, weights = rewards.resolve(cfg.grpo.rewards, tmp_path, "grpo.rewards")
    assert funcs[0].__name__ == "python_tests" and weights == [1.0, 0.1]
    completions = [[{"role": "assistant", "content": "Here:\n```python\ndef add(a, b):\n    return a + b\n```"}],
                   [{"role": "assistant", "content": "```python\nwhile True:\n    pass\n```"}],
                   [{"role": "assistant", "content": "def one():\n    return 2\n"}]]
    scores = funcs[0](prompts=[r["prompt"] for r in CODE_ROWS], completions=completions,
                      tests=[r["tests"] for r in CODE_ROWS], completion_ids=[[1]] * 3, trainer_state=TrainerState(),
                      log_extra=lambda *a, **k: None, log_metric=lambda *a, **k: None)
    assert scores == [1.0, 0.0, 0.0]
    # the call before the model loads (each prompt standing in for its completion: not code, 0)
    tok = AutoTokenizer.from_pretrained(tiny_model)
    rows = Dataset.from_list([{**r, "tests": r["tests"] if isinstance(r["tests"], list) else [r["tests"]]}
                              for r in CODE_ROWS])
    rewards.trial(cfg.grpo.rewards, funcs, rows, tok, "data.path", "grpo.rewards")
    with pytest.raises(rewards.UserError, match=r"grpo.rewards.0.function: python_tests: raised ValueError: "
                                                r"python_tests needs a `tests` column"):
        rewards.trial(cfg.grpo.rewards, funcs, Dataset.from_list([{"prompt": "x"}] * 2), tok, "data.path",
                      "grpo.rewards")


def test_a_sandbox_that_cannot_run_is_refused_before_the_model_loads(tmp_path):
    from pydantic import ValidationError

    from toolbox_train.planning import rewards

    cfg = _config([{"function": "python_tests", "sandbox": {"python": str(tmp_path / "no-python" / "bin" / "python")}}])
    with pytest.raises(rewards.UserError, match=r"^grpo.rewards.0.function: python_tests: the sandbox does not run "
                                                r"here: sandbox_error: .*no-python"):
        rewards.resolve(cfg.grpo.rewards, tmp_path, "grpo.rewards")
    for bad, why in (({"function": "format", "pattern": "x", "sandbox": {}}, "sandbox belongs to the python_tests"),
                     ({"function": "python_tests", "sandbox": {"timeout": 0}}, "timeout"),
                     ({"function": "python_tests", "sandbox": {"memory": 1}}, "memory")):
        with pytest.raises(ValidationError, match=why):
            _config([bad])
