"""`make test`'s workers keep a group on one worker (tests/conftest.py's xdist groups): with pytest 9.2
and pytest-xdist 3.8 loadgroup silently ran a group's tests on several workers at once (the pin in
pyproject.toml). A small suite of its own, run in a child pytest with the installed versions."""

from __future__ import annotations

import os
import subprocess
import sys


def test_a_group_runs_on_one_worker(tmp_path):
    (tmp_path / "test_g.py").write_text(
        "import os, pytest, time\n"
        "@pytest.mark.parametrize('i', range(6))\n"
        "@pytest.mark.xdist_group('g')\n"
        "def test_g(i):\n"
        "    open(os.environ['LOG'], 'a').write(f\"g {os.environ['PYTEST_XDIST_WORKER']}\\n\"); time.sleep(0.2)\n"
        "@pytest.mark.parametrize('i', range(6))\n"
        "def test_free(i):\n"
        "    open(os.environ['LOG'], 'a').write(f\"f {os.environ['PYTEST_XDIST_WORKER']}\\n\"); time.sleep(0.2)\n")
    log = tmp_path / "log"
    cp = subprocess.run([sys.executable, "-m", "pytest", "-q", "-n", "2", "--dist", "loadgroup", "-p", "no:cacheprovider",
                         "--rootdir", str(tmp_path), "-c", "/dev/null", str(tmp_path)],
                        capture_output=True, text=True, env={**os.environ, "LOG": str(log)}, timeout=300)
    assert cp.returncode == 0, cp.stdout[-2000:] + cp.stderr[-2000:]
    rows = [line.split() for line in log.read_text().splitlines()]
    assert len(rows) == 12
    assert len({w for kind, w in rows if kind == "g"}) == 1, rows  # the group: one worker
    assert len({w for _, w in rows}) == 2, rows  # and both workers ran something
