"""toolbox_train.safe_yaml: the bounded YAML reader stack files and training configs share."""

from __future__ import annotations

import re

import pytest
import yaml

from toolbox_train import contract as errors
from toolbox_train import safe_yaml
from toolbox_train.safe_yaml import SafeYamlError, load_file, load_text


def test_plain_values_and_positions():
    doc = load_text("a: 1\nb:\n  - x\n  - {c: 2.5, d: null, e: true, f: '010'}\n", "f.yaml")
    assert doc.data == {"a": 1, "b": ["x", {"c": 2.5, "d": None, "e": True, "f": "010"}]}
    assert doc.data == yaml.safe_load("a: 1\nb:\n  - x\n  - {c: 2.5, d: null, e: true, f: '010'}\n")
    assert doc.marks[("a",)] == (1, 1) and doc.marks[("b", 1)] == (4, 5) and doc.marks[("b", 1, "d")] == (4, 14)


def test_keys_are_text_and_merges_work():
    doc = load_text("on: 1\nbase: &b {x: 1, y: 2}\nd:\n  <<: *b\n  y: 3\n", "f")
    assert doc.data == {"on": 1, "base": {"x": 1, "y": 2}, "d": {"x": 1, "y": 3}}
    doc.data["d"]["x"] = 9  # an alias is a copy: editing one place leaves the other
    assert doc.data["base"]["x"] == 1


def test_refusals_are_user_errors_with_line_and_column():
    with pytest.raises(SafeYamlError) as exc:
        load_text("a:\n  b: !foo x\n", "f.yaml")
    assert str(exc.value) == "f.yaml:2:6: a.b: tag !foo is not allowed (plain YAML values only)"
    assert isinstance(exc.value, errors.UserError) and exc.value.exit_code == 2
    assert (exc.value.line, exc.value.column, exc.value.path) == (2, 6, ("a", "b"))


@pytest.mark.parametrize("text, problem", [
    ("a: 1\na: 2\n", "duplicate key"),
    ("? {a: 1}\n: 2\n", "as a key"),
    ("a: *x\n", "alias *x has no anchor"),
    ("*x : 1\n", "an alias as a key"),
    ("a: &x 1\n*x : 2\n", "an alias as a key"),
    ("a: !!set {x}\n", "tag !!set is not allowed"),
    ("a: [" * 100, "nested deeper than 64 levels"),
    ("a: 2026-02-30\n", "cannot read '2026-02-30' as timestamp"),
    ("a: \x07\n", "control character U+0007"),
])
def test_each_refusal(text, problem):
    with pytest.raises(SafeYamlError, match=re.escape(problem)):
        load_text(text, "f")


def test_limits_are_parameters():
    with pytest.raises(SafeYamlError, match="nested deeper than 2 levels"):
        load_text("a: {b: {c: 1}}", "f", max_depth=2)
    bomb = "a: &a [1, 1, 1, 1]\nb: &b [*a, *a, *a, *a]\nc: [*b, *b, *b, *b]\n"
    assert len(load_text(bomb, "f").data["c"]) == 4
    with pytest.raises(SafeYamlError, match="aliases expand to more than 50 values"):
        load_text(bomb, "f", max_nodes=50)


def test_a_large_file_without_aliases_loads():
    text = "a:\n" + "".join(f"  k{i}: [v{i}, {i}, {{x: {i}}}]\n" for i in range(25000))  # ~0.9 MB, 125k values
    assert len(text) < safe_yaml.MAX_BYTES and len(load_text(text, "f").data["a"]) == 25000


def test_files(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_bytes(b"a: 1\n")
    assert load_file(p).data == {"a": 1}
    p.write_bytes(b"a: \xff\n")
    with pytest.raises(SafeYamlError, match=r"c.yaml:1:4: not UTF-8 text \(byte 0xff\); is this a config\?"):
        load_file(p, what="config")
    with pytest.raises(SafeYamlError, match="is more than a YAML file may be"):
        load_file(p, max_bytes=3)
    with pytest.raises(SafeYamlError, match="cannot read"):
        load_file(tmp_path / "absent.yaml")
    (tmp_path / "e.yaml").write_text("")
    assert load_file(tmp_path / "e.yaml").data is None
    assert safe_yaml.MAX_BYTES == 1 << 20
