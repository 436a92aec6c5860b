"""The cpu image is built from its hashed Python lock (issue 12, item 4): the session's cpu
image carries the lock's sha256 as a label, and a tampered hash in the lock fails the build at
the torch step with nothing tagged."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from helpers.enginekit import ca_bundle, podman, toolbox, wheelhouse

pytestmark = pytest.mark.slow
STACKS = Path(__file__).resolve().parents[2] / "toolbox" / "stacks"


def test_cpu_image_is_built_from_its_lock(cpu_image):
    from toolbox.stack import python_lock
    from toolbox.stack.load import load_stack

    lock = python_lock.current(load_stack("cpu"))
    assert lock is not None, "toolbox/stacks/cpu.pylock.txt is stale: run `toolbox lock --stack cpu`"
    labels = json.loads(podman("image", "inspect", "--format", "{{json .Labels}}", cpu_image["tag"]).stdout)
    assert labels["io.github.toolbox.python.lock.sha256"] == python_lock.content_digest(lock)
    assert cpu_image["stdout"].count("--require-hashes") >= 2


def test_tampered_lock_hash_fails_the_build(base_image, tmp_path):
    """A copy of the cpu stack whose lock has one wrong sha256 for torch's wheel."""
    shutil.copy(STACKS / "cpu.yaml", tmp_path / "cpu.yaml")
    text = (STACKS / "cpu.pylock.txt").read_text()
    block = re.search(r"^torch==\S+ \\\n    --hash=sha256:([0-9a-f]{64})", text, re.M)
    assert block, "no torch entry in cpu.pylock.txt"
    good = block.group(1)
    bad = ("0" if good[0] != "0" else "1") + good[1:]
    from toolbox.run_options import default_tag
    from toolbox.stack import statefiles
    from toolbox.stack.load import load_stack

    # its checksum made to fit (an edit by hand is refused before any build: test_state_files.py):
    # the bytes pip is given are what must fail
    (tmp_path / "cpu.pylock.txt").write_text(statefiles.with_checksum(text.replace(good, bad)))

    tag = default_tag(load_stack(str(tmp_path / "cpu.yaml")))
    cp = toolbox("build", "--stack", str(tmp_path / "cpu.yaml"), "--engine", "podman",
                 "--ca-bundle", str(ca_bundle()), "--wheelhouse", str(wheelhouse()), timeout=1800)
    out = cp.stdout + cp.stderr
    assert cp.returncode == 1, out[-4000:]
    assert "DO NOT MATCH THE HASHES" in out and bad in out and good in out, out[-4000:]
    assert "--torch-index" in cp.stderr.split("last lines:")[0]  # the failed step is the torch step
    assert podman("image", "exists", tag, check=False).returncode == 1
