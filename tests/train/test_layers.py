"""The training package in layers (issue 34): each folder of `toolbox_train` is one layer, and a
module imports only from its own layer and the layers below it, in the order docs/architecture.md
writes down (## Layers of the training package). A layer is a folder (issue 45: no folder holds two
layers; the objectives' declarations and trainers were one folder in two layers, and six imports ran
back up into it). Imports inside functions and under TYPE_CHECKING count, as for the host's circles
(tests/test_layout_host.py); the graph is read with `ast`, nothing is imported to check it. The one
import the graph cannot see, units/registry.py finding the objective units by name, is held by
test_only_the_registry_imports_objectives_by_name."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

from test_layout_host import import_graph, modules

ROOT = Path(__file__).resolve().parents[2]
PKG = ROOT / "entrypoints" / "toolbox_train"
DOC = ROOT / "docs" / "architecture.md"


def layer_order(text: str) -> list[str]:
    """The layers as the page lists them, bottom first: 'toolbox_train' (its own modules), then
    its folders ('config', ...)."""
    m = re.search(r"^## Layers of the training package\n(.*?)(?=^## |\Z)", text, re.M | re.S)
    assert m, f"{DOC}: no section '## Layers of the training package'"
    return [name.rstrip("/") for name in re.findall(r"^\d+\. `([\w/]+)`", m.group(1), re.M)]


def back_edges(package: Path, order: list[str]) -> list[str]:
    """Every import of a module from a layer above its own: 'a -> b (layer x imports layer y)'."""
    top = package.name
    folders = {p.name for p in package.iterdir() if (p / "__init__.py").is_file()}

    def layer(module: str) -> str:
        parts = module.split(".")
        return parts[1] if len(parts) > 1 and parts[1] in folders else top

    rank = {name: i for i, name in enumerate(order)}
    graph = import_graph(modules({top: package}))
    found = []
    for a, targets in sorted(graph.items()):
        for b in sorted(targets):
            la, lb = layer(a), layer(b)
            if rank[lb] > rank[la]:
                found.append(f"{a} -> {b} (layer {la} imports layer {lb})")
    return found


def test_the_page_lists_every_folder_of_the_training_package_once():
    order = layer_order(DOC.read_text(encoding="utf-8"))
    folders = sorted(p.name for p in PKG.iterdir() if (p / "__init__.py").is_file())
    assert order[0] == "toolbox_train" and len(order) == len(set(order)), order
    assert sorted(order[1:]) == folders, f"the page's layers {order[1:]}; the package's folders {folders}"


def test_imports_point_down_the_layers_only():
    found = back_edges(PKG, layer_order(DOC.read_text(encoding="utf-8")))
    assert not found, "imports against the layer order of docs/architecture.md:\n" + "\n".join(found)


def test_an_added_back_edge_is_found(tmp_path):
    # A check that cannot fail proves nothing: the real package, with one import added inside a
    # function (config's schema asking the finetune command), and one under TYPE_CHECKING.
    copy = tmp_path / "toolbox_train"
    shutil.copytree(PKG, copy, ignore=shutil.ignore_patterns("__pycache__"))
    order = layer_order(DOC.read_text(encoding="utf-8"))
    assert back_edges(copy, order) == []
    schema = copy / "config" / "schema.py"
    schema.write_text(schema.read_text() + "\n\ndef _late():\n    from toolbox_train.commands import finetune\n")
    runs = copy / "runs" / "folder.py"
    runs.write_text(runs.read_text() + "\nfrom typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                    "    from toolbox_train.training.trainer import Toolbox\n")
    loading = copy / "training" / "loading.py"  # a lower layer reaching an objective's unit
    loading.write_text(loading.read_text() + "\n\ndef _late():\n    from toolbox_train.objectives.dpo import UNIT\n")
    assert back_edges(copy, order) == [
        "toolbox_train.config.schema -> toolbox_train.commands.finetune (layer config imports layer commands)",
        "toolbox_train.runs.folder -> toolbox_train.training.trainer (layer runs imports layer training)",
        "toolbox_train.training.loading -> toolbox_train.objectives.dpo (layer training imports layer objectives)"]


def dynamic_imports(package: Path) -> list[str]:
    """'module: text' of every importlib.import_module / __import__ call whose argument names the
    objectives package (a string or f-string holding 'objectives', or the registry's `package`)."""
    import ast

    found = []
    for mod, path in modules({package.name: package}).items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call) and ast.unparse(node.func) in ("importlib.import_module", "import_module",
                                                                          "__import__"):
                arg = ast.unparse(node.args[0]) if node.args else ""
                if "objectives" in arg or "package" in arg.lower():
                    found.append(f"{mod}: {arg}")
    return sorted(found)


def test_only_the_registry_imports_objectives_by_name():
    # The layers hold because nothing below objectives/ imports it; the registry finding the units is
    # the one import by name of them (a plug-in's entry point), and no other module may add one.
    assert [f.split(":")[0] for f in dynamic_imports(PKG)] == ["toolbox_train.units.registry"] * 2, dynamic_imports(PKG)


def test_an_import_of_objectives_by_name_elsewhere_is_found(tmp_path):
    copy = tmp_path / "toolbox_train"
    shutil.copytree(PKG, copy, ignore=shutil.ignore_patterns("__pycache__"))
    mem = copy / "planning" / "memory.py"
    mem.write_text(mem.read_text() + '\n\ndef _late(name):\n    import importlib\n\n'
                   '    return importlib.import_module(f"toolbox_train.objectives.{name}")\n')
    assert "toolbox_train.planning.memory: f'toolbox_train.objectives.{name}'" in dynamic_imports(copy)


def test_no_folder_over_15_modules_and_no_module_over_400_lines():
    # The host's package too: a module over ~400 lines, or a folder over 15, is doing two jobs.
    big_folders, long_modules = {}, {}
    for top in (PKG, ROOT / "toolbox"):
        for d in [top, *top.rglob("*")]:
            n = len([f for f in d.glob("*.py") if f.name != "__init__.py"]) if d.is_dir() else 0
            if n > 15:
                big_folders[str(d.relative_to(ROOT))] = n
        for f in top.rglob("*.py"):
            n = len(f.read_text(encoding="utf-8").splitlines())
            if n > 400:
                long_modules[str(f.relative_to(ROOT))] = n
    assert not big_folders and not long_modules, (big_folders, long_modules)
