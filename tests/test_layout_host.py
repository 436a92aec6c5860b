"""Module boundaries of the product (issue 22): no import circle among the project's modules.

An import counts wherever it is written: at the top, under `if TYPE_CHECKING:` or inside a
function (a circle of those still ties the modules together for a reader and a refactoring).
The graph is read from the source with `ast`, so nothing is imported to check it.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = {"toolbox": ROOT / "toolbox", "toolbox_train": ROOT / "entrypoints" / "toolbox_train"}


def modules(packages: dict[str, Path]) -> dict[str, Path]:
    """{dotted module name: file} of every module under the packages' folders."""
    out = {}
    for top, folder in packages.items():
        for path in sorted(folder.rglob("*.py")):
            parts = [top, *path.relative_to(folder).with_suffix("").parts]
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(parts)] = path
    return out


def import_graph(mods: dict[str, Path]) -> dict[str, set[str]]:
    """{module: the project's modules it imports}; `from pkg import name` names pkg.name where
    that is a module, else pkg (its __init__)."""

    def known(name: str) -> str | None:
        while name and name not in mods:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {m: set() for m in mods}
    for mod, path in mods.items():
        package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(parent + ([base] if base else []))
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base for a in node.names]
            else:
                continue
            graph[mod] |= {t for t in map(known, targets) if t is not None and t != mod}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                comp = []
                while True:
                    m = stack.pop()
                    on_stack.discard(m)
                    comp.append(m)
                    if m == node:
                        break
                if len(comp) > 1:
                    found.append(sorted(comp))
    return found


def test_no_import_circle_in_the_product():
    found = cycles(import_graph(modules(PACKAGES)))
    assert not found, "import circles (each a set of modules that import each other): " + "; ".join(
        " <-> ".join(c) for c in found)


def test_the_check_sees_circles_through_type_checking_and_functions(tmp_path):
    # A check that cannot fail proves nothing: a small package with the two kinds of circle
    # the project had (a TYPE_CHECKING import back, an import inside a function back).
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.a import A\n")
    (pkg / "a.py").write_text("from pkg import b\nclass A: ...\n")
    (pkg / "b.py").write_text("import pkg\n")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "sub" / "c.py").write_text("def f():\n    from . import d\n")
    (pkg / "sub" / "d.py").write_text("from pkg.sub.c import f\n")
    (pkg / "sub" / "e.py").write_text("from pkg.sub import c\nimport json\n")  # one way: no circle
    found = cycles(import_graph(modules({"pkg": pkg})))
    assert sorted(found) == [["pkg", "pkg.a", "pkg.b"], ["pkg.sub.c", "pkg.sub.d"]]


def test_the_stack_package_imports_no_command_and_no_component_imports_the_stack():
    # The data path runs one way: commands -> stack (model composes the blocks, load collects the
    # pins) -> components, which receive the resolved stack as an argument and import none of it.
    graph = import_graph(modules(PACKAGES))
    stack_mods = [m for m in graph if m.startswith("toolbox.stack.") or m == "toolbox.stack"]
    assert {"toolbox.stack.load", "toolbox.stack.resolved", "toolbox.stack.digest"} <= set(stack_mods)
    assert not {t for m in stack_mods for t in graph[m] if t.startswith("toolbox.commands")}
    comps = [m for m in graph if m.startswith("toolbox.components")]
    assert len(comps) > 10 and not {t for m in comps for t in graph[m] if t.startswith("toolbox.stack")}


def test_shared_host_options_are_declared_once():
    # --stack and --set mean the same in every command: toolbox/commands/options.py declares them.
    import argparse

    from toolbox import cli

    literal = {}
    for path in sorted((ROOT / "toolbox").rglob("*.py")):
        if path.name == "options.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Constant) and node.value in ("--stack", "--set"):
                literal.setdefault(node.value, []).append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert not literal, f"declared outside toolbox/commands/options.py: {literal}"

    seen = {}

    def walk(parser: argparse.ArgumentParser, prog: str) -> None:
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    walk(sub, f"{prog} {name}")
            elif {"--stack", "--set"} & set(action.option_strings):
                seen.setdefault(action.option_strings[0], set()).add((action.dest, action.metavar, type(action).__name__))
                seen.setdefault(action.option_strings[0] + " commands", set()).add(prog)

    walk(cli.build_parser(), "toolbox")
    assert seen["--stack"] == {("stack", "NAME|PATH", "_StoreAction")}
    assert seen["--set"] == {("overrides", "KEY.PATH=VALUE", "_AppendAction")}
    assert len(seen["--stack commands"]) >= 9 and len(seen["--set commands"]) >= 7


def folder_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """{folder: the other folders its modules import}, a folder being a package's first-level
    subpackage (toolbox.stack.load -> toolbox.stack). A module at a package's top (toolbox.paths,
    toolbox.cli) stays its own node: the top holds both the entry point and what all share."""
    packages = {m for m in graph if any(o.startswith(m + ".") for o in graph)}

    def folder(mod: str) -> str:
        parts = mod.split(".")
        return ".".join(parts[:2]) if len(parts) > 1 and parts[0] + "." + parts[1] in packages else mod

    out: dict[str, set[str]] = {}
    for mod, targets in graph.items():
        here = folder(mod)
        out.setdefault(here, set())
        out[here] |= {f for f in map(folder, targets) if f != here}
    return out


def test_no_import_circle_between_folders():
    # Module circles are not all: a folder that imports another one that imports it back (stack and
    # components, say) is one layer split in two, whichever modules carry the imports.
    found = cycles(folder_graph(import_graph(modules(PACKAGES))))
    assert not found, "folders that import each other: " + "; ".join(" <-> ".join(c) for c in found)


def test_the_folder_check_sees_a_circle_of_modules_that_is_none(tmp_path):
    # pkg.a.x imports pkg.b.y in a function, pkg.b.z imports pkg.a.w under TYPE_CHECKING: no module
    # circle, a folder one. pkg.c imports pkg.a one way: none.
    pkg = tmp_path / "pkg"
    for sub in ("a", "b", "c"):
        (pkg / sub).mkdir(parents=True)
        (pkg / sub / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "a" / "x.py").write_text("def f():\n    from pkg.b import y\n")
    (pkg / "a" / "w.py").write_text("")
    (pkg / "b" / "y.py").write_text("")
    (pkg / "b" / "z.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.a.w import W\n")
    (pkg / "c" / "v.py").write_text("from pkg.a import x\n")
    graph = import_graph(modules({"pkg": pkg}))
    assert not cycles(graph)
    assert cycles(folder_graph(graph)) == [["pkg.a", "pkg.b"]]
