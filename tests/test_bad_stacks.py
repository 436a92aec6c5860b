"""Bad stack input (issue 13): each regression file in tests/corpus/stacks/ is refused with
exit 2 and one line naming file:line(:column), nothing written; no traceback, no hang."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from toolbox import cli

ROOT = Path(__file__).resolve().parents[1]
CORPUS = ROOT / "tests" / "corpus" / "stacks"

# file -> what the one line must say after "toolbox: error: <file>"
EXPECT = {
    "alias-bomb.yaml": r":\d+:\d+: x\d\.\d+: aliases expand to more than 100000 values",
    "complex-key.yaml": r":2:3: a list or mapping as a key \(`\? \[a, b\]`\) is not allowed",
    "custom-tag.yaml": r":2:14: description: tag !foo is not allowed",
    "python-tag.yaml": r":2:14: description: tag !!python/object/apply:os.system is not allowed",
    "deep-nesting.yaml": r":2:\d+: gpu_targets\.0\.0\.0\..*: nested deeper than 64 levels",
    "duplicate-key.yaml": r":3:1: description: duplicate key",
    "two-documents.yaml": r":2:1: more than one YAML document",
    "extends-unknown.yaml": r":2: extends: no stack 'nosuchstack'",
    "extends-missing-path.yaml": r":2: extends: no stack './no-such-file.yaml'",
    "gpu-targets-on-cpu.yaml": r":3: gpu_targets: gpu_targets only belongs to platform rocm",
    "recursive-alias.yaml": r":2:19: image.title: alias \*i refers to the collection it is in",
    "malformed.yaml": r":3:1: hf\.trl\.1: malformed YAML",
    "nul-byte.yaml": r":2:15: a NUL byte: not allowed in YAML",
    "latin1.yaml": r":2:17: not UTF-8 text \(byte 0xe9\)",
    "unknown-key-in-alias.yaml": r":3: hf\.title: unknown key",  # merged in by `<<: *img`
}


def refused(capsys, argv: list[str], shown: str, expect: str) -> None:
    assert cli.main(argv) == 2
    out = capsys.readouterr()
    assert "Traceback" not in out.err and out.err.count("\n") == 1, out.err
    assert re.match(rf"toolbox: error: {re.escape(shown)}{expect}", out.err), out.err


def test_corpus_lists_every_file():
    assert sorted(EXPECT) == sorted(p.name for p in CORPUS.glob("*.yaml") if p.name != "bom-and-crlf.yaml")


@pytest.mark.parametrize("name", sorted(EXPECT))
def test_bad_stack_file(name, tmp_path, capsys):
    stack = str(CORPUS / name)
    out = tmp_path / "Dockerfile"
    out.write_bytes(b"an existing render\n")
    refused(capsys, ["render", "--stack", stack, "-o", str(out)], stack, EXPECT[name])
    assert out.read_bytes() == b"an existing render\n" and sorted(tmp_path.iterdir()) == [out]
    refused(capsys, ["context", "--stack", stack, "-o", str(tmp_path / "ctx")], stack, EXPECT[name])
    assert not (tmp_path / "ctx").exists()


def test_bom_and_crlf_are_fine(capsys):
    assert cli.main(["render", "--stack", str(CORPUS / "bom-and-crlf.yaml")]) == 0
    assert "# ---- base:" in capsys.readouterr().out


def test_too_big_is_refused_before_reading(tmp_path, capsys):
    big = tmp_path / "big.yaml"
    with open(big, "wb") as f:  # sparse: 60 MB long, no disk used
        f.truncate(60_000_000)
    refused(capsys, ["render", "--stack", str(big)], str(big), r": 60\.0 MB is more than a stack file may be")


@pytest.mark.parametrize("override, expect", [
    ("gpu_targets=" + "[" * 900 + "]" * 900, "gpu_targets: Input should be a valid list"),
    ("description=!foo x", None),  # not YAML as a value: taken as the text itself, which fits
    ("hf.trl=&a [*a]", "hf.trl: must be an exact version"),
    ("base=1", "base: Input should be a valid dictionary"),
])
def test_set_values(override, expect, capsys):
    code = cli.main(["render", "--stack", "cpu", "--set", override])
    err = capsys.readouterr().err
    assert "Traceback" not in err
    if expect is None:
        assert code == 0
    else:
        assert code == 2 and err.startswith(f"toolbox: error: --set {override}: {expect}"), err[:300]


def test_real_processes(tmp_path):
    """The same through a real `python -m toolbox`: a binary file and the alias bomb, quickly."""
    for stack, expect in (("/bin/true", r"/bin/true:\d+:\d+: not UTF-8 text"),
                          (str(CORPUS / "alias-bomb.yaml"), "aliases expand to more than 100000 values")):
        out = tmp_path / "Dockerfile"
        out.write_text("keep\n")
        r = subprocess.run([sys.executable, "-m", "toolbox", "render", "--stack", stack, "-o", str(out)],
                           cwd=ROOT, capture_output=True, text=True, timeout=60,
                           env={**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "entrypoints")])})
        assert r.returncode == 2 and "Traceback" not in r.stderr and r.stderr.count("\n") == 1, r.stderr
        assert re.search(expect, r.stderr) and out.read_text() == "keep\n"
