"""The objective registry (issue 39): objectives/__init__.py's REGISTRY is the one list of
objectives. The schema's `objective:` and sections, the checks and the docs' table read it; no other
module writes two objective names into one tuple, list, set or dict (`cfg.objective in ("dpo",
"orpo")` is a list of objectives kept somewhere else). Read with `ast`, nothing run."""

from __future__ import annotations

import ast
import re
import shutil
import typing
from pathlib import Path

from toolbox_train import objectives
from toolbox_train.config.schema import TrainConfig

ROOT = Path(__file__).resolve().parents[2]
PKG = ROOT / "entrypoints" / "toolbox_train"


def lists_of_objectives(package: Path, names) -> list[str]:
    """'file:line' of each literal collection holding two or more objective names."""
    names, found = set(names), []
    for path in sorted(package.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            items = node.keys if isinstance(node, ast.Dict) else \
                node.elts if isinstance(node, (ast.Tuple, ast.List, ast.Set)) else []
            words = {k.value for k in items if isinstance(k, ast.Constant) and isinstance(k.value, str)}
            if len(words & names) >= 2:
                found.append(f"{path.relative_to(package)}:{node.lineno}")
    return found


def test_no_module_writes_a_list_of_objectives():
    found = lists_of_objectives(PKG, objectives.REGISTRY)
    assert not found, f"objective names listed outside the registry (read objectives.REGISTRY): {found}"


def test_a_list_of_objectives_is_found(tmp_path):
    # A check that cannot fail proves nothing: the check of memory.py as it was before the registry.
    copy = tmp_path / "toolbox_train"
    shutil.copytree(PKG, copy, ignore=shutil.ignore_patterns("__pycache__"))
    mem = copy / "planning" / "memory.py"
    mem.write_text(mem.read_text() + '\n\ndef _rows(objective):\n    return 2 if objective in ("dpo", "orpo") else 1\n')
    assert lists_of_objectives(copy, objectives.REGISTRY) == [f"planning/memory.py:{len(mem.read_text().splitlines())}"]


def test_the_schema_reads_the_registry():
    assert typing.get_args(TrainConfig.model_fields["objective"].annotation) == tuple(objectives.REGISTRY)
    sections = {n for n, u in objectives.REGISTRY.items() if u.section}
    assert sections <= set(TrainConfig.model_fields)
    for name in sections:
        assert TrainConfig.model_fields[name].annotation is objectives.REGISTRY[name].section


def test_the_docs_table_of_objectives_is_the_registry():
    # docs/preference.md's table: one row per objective, its data format as the unit declares it
    text = (ROOT / "docs" / "preference.md").read_text(encoding="utf-8")
    rows = re.findall(r"^\| `(\w+)`(?: \(default\))? \| [^|]+ \| ([^|]+) \|", text, re.M)
    assert [r[0] for r in rows] == list(objectives.REGISTRY), rows
    for name, fmt in rows:
        want = objectives.REGISTRY[name].data_format
        assert fmt.strip() == (want or "text, alpaca, messages"), (name, fmt)
