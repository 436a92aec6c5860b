"""The objective registry (issue 39; found by walking objectives/ since issue 45): units/registry.py's
REGISTRY is the one list of objectives. The schema's `objective:` and sections, the checks and the
docs' table read it; no other module writes two objective names into one tuple, list, set or dict
(`cfg.objective in ("dpo", "orpo")` is a list of objectives kept somewhere else), and no module
outside an objective's folder names it in code (issue 45). Read with `ast`, nothing run."""

from __future__ import annotations

import ast
import re
import shutil
import typing

import pytest
from pathlib import Path

from toolbox_train.units import registry
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
    found = lists_of_objectives(PKG, registry.REGISTRY)
    assert not found, f"objective names listed outside the registry (read registry.REGISTRY): {found}"


def test_a_list_of_objectives_is_found(tmp_path):
    # A check that cannot fail proves nothing: the check of memory.py as it was before the registry.
    copy = tmp_path / "toolbox_train"
    shutil.copytree(PKG, copy, ignore=shutil.ignore_patterns("__pycache__"))
    mem = copy / "planning" / "memory.py"
    mem.write_text(mem.read_text() + '\n\ndef _rows(objective):\n    return 2 if objective in ("dpo", "orpo") else 1\n')
    assert lists_of_objectives(copy, registry.REGISTRY) == [f"planning/memory.py:{len(mem.read_text().splitlines())}"]


def test_the_schema_reads_the_registry():
    assert typing.get_args(TrainConfig.model_fields["objective"].annotation) == tuple(registry.REGISTRY)
    sections = {n for n, u in registry.REGISTRY.items() if u.section}
    assert sections <= set(TrainConfig.model_fields)
    for name in sections:
        assert TrainConfig.model_fields[name].annotation is registry.REGISTRY[name].section


def test_the_docs_table_of_objectives_is_the_registry():
    # docs/preference.md's table: one row per objective, its data format as the unit declares it
    text = (ROOT / "docs" / "preference.md").read_text(encoding="utf-8")
    rows = re.findall(r"^\| `(\w+)`(?: \(default\))? \| [^|]+ \| ([^|]+) \|", text, re.M)
    assert [r[0] for r in rows] == list(registry.REGISTRY), rows
    for name, fmt in rows:
        want = registry.REGISTRY[name].data_format
        assert fmt.strip() == (want or "text, alpaca, messages"), (name, fmt)


# Objective names that are also plain words of the field ("a reward function", TRL's `reward` metric):
# only the objective's own forms name it there (`objective reward`, its section `cfg.reward`, `reward.x`).
PLAIN_WORDS = {"reward"}
ELSEWHERE = {"bench"}  # the benchmark harness runs named finetune configurations, as a user's train.yaml does
# TRL's own names that are an objective's too, each with its reason
TRL_NAMES = {("objectives/dpo/__init__.py", "sft"): "DPOConfig.loss_type 'sft' (an SFT loss on chosen)"}


def names_outside(package: Path, names) -> list[str]:
    """'file:line name' of each place a module outside objectives/<name>/ names objective <name> in its
    code: an identifier or attribute (`cfg.grpo`, `grpo_rewards`), an import of its folder, or a string
    that is not a docstring holding the name as a word (an error message naming `grpo.rewards` included).
    Comments and docstrings are prose, not read."""
    found = []
    for path in sorted(package.rglob("*.py")):
        rel = path.relative_to(package)
        if rel.parts[0] in ELSEWHERE:
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        docs = {id(n.body[0].value) for n in ast.walk(tree) if isinstance(
            n, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and n.body
            and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs:
                words, text = None, node.value
            elif isinstance(node, ast.Name):
                words, text = node.id, None
            elif isinstance(node, ast.Attribute):
                words, text = node.attr, None
            elif isinstance(node, (ast.FunctionDef, ast.ClassDef, ast.arg)):
                words, text = getattr(node, "name", None) or node.arg, None
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                words = ".".join([getattr(node, "module", None) or ""] + [a.name for a in node.names])
                text = None
            elif isinstance(node, ast.Compare) and "objective" in ast.unparse(node):  # cfg.objective == "x"
                words, text = None, ast.unparse(node)
            else:
                continue
            for name in names:
                if len(rel.parts) > 1 and rel.parts[:2] == ("objectives", name) or (str(rel), name) in TRL_NAMES:
                    continue
                if words is not None and name in PLAIN_WORDS:
                    hit = (isinstance(node, ast.Attribute) and words == name) or f"objectives.{name}" in words
                elif words is not None:
                    hit = name in re.split(r"[._]", words.lower())
                elif name in PLAIN_WORDS:
                    hit = bool(re.search(rf"(?:objective:? ?\W*{name}\b|(?<![\w-]){name}\.\w)", text, re.I))
                else:
                    hit = bool(re.search(rf"(?<![\w-]){name}(?![\w-])", text, re.I))
                if hit:
                    found.append(f"{rel}:{node.lineno} {name}")
    return found


def test_no_module_outside_an_objectives_folder_names_it():
    found = names_outside(PKG, registry.REGISTRY)
    assert not found, "objectives named outside their folder (read the unit through the run or the registry):\n" \
        + "\n".join(found)


def test_a_named_objective_is_found(tmp_path):
    # A check that cannot fail proves nothing: the memory planner reading GRPO's section again, a message
    # naming the field, and a comment and a docstring, which are prose and pass.
    copy = tmp_path / "toolbox_train"
    shutil.copytree(PKG, copy, ignore=shutil.ignore_patterns("__pycache__"))
    mem = copy / "planning" / "memory.py"
    n = len(mem.read_text().splitlines())
    mem.write_text(mem.read_text() + '\n\ndef _late(cfg):\n    """grpo in prose."""\n    # grpo in a comment\n'
                   '    return cfg.grpo.beta, "see reward.center_rewards_coefficient"\n')
    assert sorted(names_outside(copy, registry.REGISTRY)) == [f"planning/memory.py:{n + 6} grpo",
                                                               f"planning/memory.py:{n + 6} reward"]


def test_a_unit_is_found_by_its_folder_alone(tmp_path, monkeypatch):
    # The registry walks the package: a folder with a UNIT is an objective, with no list to add it to; a
    # UNIT named otherwise than its folder, or no default, is refused when the package is read.
    import sys

    pkg = tmp_path / "someunits"
    for name, default in (("beta", False), ("alpha", False), ("zeta", True)):
        (pkg / name).mkdir(parents=True)
        (pkg / name / "__init__.py").write_text(
            "from toolbox_train.units.objective import Objective\n"
            f"UNIT = Objective({name!r}, 'a test unit', default={default})\n")
    (pkg / "__init__.py").write_text("")
    (pkg / "notes.py").write_text("")  # a module, not a unit
    monkeypatch.syspath_prepend(str(tmp_path))
    # no cached bytecode: the rewrite below keeps the file's size, and within the same second as the first import
    # Python would take the stale .pyc for it (a run without PYTHONDONTWRITEBYTECODE failed so)
    monkeypatch.setattr(sys, "dont_write_bytecode", True)
    assert list(registry.found("someunits")) == ["zeta", "alpha", "beta"]
    (pkg / "alpha" / "__init__.py").write_text((pkg / "alpha" / "__init__.py").read_text().replace("'alpha'", "'gamma'"))
    for m in [m for m in sys.modules if m.startswith("someunits")]:
        monkeypatch.delitem(sys.modules, m)
    with pytest.raises(ImportError, match="someunits.alpha: its UNIT is named 'gamma'"):
        registry.found("someunits")
