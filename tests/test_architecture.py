"""docs/architecture.md against the tree (issue 22): the page names what exists, and every
package exists on the page.

Checked facts: the package table (each package's row, its docstring's first sentence, exactly
the modules it has), the boundaries the page states (each line against the import graph), the
list of training modules the host imports, that the training package imports nothing of the
host, and that every training console script ends in the one CLI guard. A failure prints the
row or list the page should have. The layer order is tests/train/test_layers.py's.
"""

from __future__ import annotations

import ast
import re
import tomllib
from pathlib import Path

from test_layout_host import PACKAGES, import_graph, modules

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "architecture.md"
PATH_OF = {"toolbox": "toolbox", "toolbox_train": "entrypoints/toolbox_train"}


def section(title: str, text: str | None = None) -> str:
    text = DOC.read_text(encoding="utf-8") if text is None else text
    m = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## |\Z)", text, re.M | re.S)
    assert m, f"{DOC}: no section '## {title}'"
    return m.group(1)


def packages() -> dict[str, Path]:
    """{dotted name: folder} of every package (a folder with __init__.py) of the product."""
    out = {}
    for top, folder in PACKAGES.items():
        for init in sorted(folder.rglob("__init__.py")):
            rel = init.parent.relative_to(folder).parts
            out[".".join((top, *rel))] = init.parent
    return out


def summary(folder: Path) -> str:
    """The first sentence of the package's docstring, on one line."""
    doc = ast.get_docstring(ast.parse((folder / "__init__.py").read_text(encoding="utf-8"))) or ""
    para = " ".join(doc.split("\n\n")[0].split())
    m = re.match(r"(.+?[.!?])(?:\s|$)", para)
    return m.group(1) if m else para


def own_modules(folder: Path) -> list[str]:
    """The package's modules and subpackages, as the table names them."""
    mods = sorted(p.stem for p in folder.glob("*.py") if p.stem != "__init__")
    subs = sorted(f"{p.name}/" for p in folder.iterdir() if (p / "__init__.py").is_file())
    return mods + subs


def top_level_names(path: Path) -> set[str]:
    """What a module defines or imports at its top level (functions, classes, constants)."""
    names = set()
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {t.id for t in targets if isinstance(t, ast.Name)}
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
    return names


def table_rows(text: str | None = None) -> dict[str, tuple[str, list[str]]]:
    """{package: (summary, modules)} from the page's package table."""
    rows = {}
    for line in section("Packages", text).splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")] if line.startswith("| `") else []
        if len(cells) == 3:
            pkg = cells[0].strip("`").rstrip("/")
            rows[pkg] = (cells[1], re.findall(r"`([^`]+)`", cells[2]))
    return rows


def expected_row(name: str, folder: Path) -> str:
    shown = f"{PATH_OF[name.split('.')[0]]}/{'/'.join(name.split('.')[1:])}".rstrip("/") + "/"
    return f"| `{shown}` | {summary(folder)} | {', '.join(f'`{m}`' for m in own_modules(folder))} |"


def row_key(name: str) -> str:
    return f"{PATH_OF[name.split('.')[0]]}/{'/'.join(name.split('.')[1:])}".rstrip("/")


def test_every_package_has_its_row_and_every_row_a_package():
    pkgs = packages()
    rows = table_rows()
    want = {row_key(n): n for n in pkgs}
    missing = [expected_row(want[k], pkgs[want[k]]) for k in sorted(set(want) - set(rows))]
    gone = sorted(set(rows) - set(want))
    assert not missing and not gone, ("docs/architecture.md, ## Packages: rows to add:\n" + "\n".join(missing)
                                      + f"\nrows naming no package: {gone}")


def wrong_rows(text: str | None = None) -> list[str]:
    """The rows whose summary is not the docstring's or whose module list is not exactly the
    package's, as they should read."""
    pkgs = packages()
    want = {row_key(n): n for n in pkgs}
    wrong = []
    for key, (said, named) in table_rows(text).items():
        if key not in want:
            continue  # the test above reports it
        folder = pkgs[want[key]]
        if said != summary(folder) or named != own_modules(folder):
            wrong.append(expected_row(want[key], folder))
    return wrong


def test_each_row_says_what_its_docstring_says_and_lists_exactly_its_modules():
    wrong = wrong_rows()
    assert not wrong, "docs/architecture.md, ## Packages: rows as they should read:\n" + "\n".join(wrong)


def test_a_false_module_list_is_found():
    # A module left out, or one that does not exist, in one row: both reported.
    text = DOC.read_text(encoding="utf-8")
    row = next(line for line in text.splitlines() if line.startswith("| `entrypoints/toolbox_train/planning/` |"))
    for bad in (row.replace("`memory`, ", ""), row.replace("`run`", "`run`, `checks`")):
        assert bad != row
        assert [r.split(" |")[0] for r in wrong_rows(text.replace(row, bad))] == ["| `entrypoints/toolbox_train/planning/`"]


def test_the_page_names_only_modules_and_folders_that_exist():
    # Any `path/like/this.py` or `dotted.module` the page mentions must be in the tree.
    text = DOC.read_text(encoding="utf-8")
    mods = modules(PACKAGES)
    missing = []
    for path in set(re.findall(r"`((?:toolbox|entrypoints|dockerfiles|tests|docs)/[\w./-]*)`", text)):
        if not (ROOT / path.split(" ")[0]).exists():
            missing.append(path)
    for dotted in set(re.findall(r"`(toolbox(?:_train)?(?:\.\w+)+)", text)):
        module, _, name = dotted.rpartition(".")
        if dotted not in mods and not (module in mods and name in top_level_names(mods[module])):
            missing.append(dotted)
    assert not missing, f"docs/architecture.md names what does not exist: {sorted(missing)}"


def test_what_the_host_imports_from_the_training_package_is_what_the_page_lists():
    graph = import_graph(modules(PACKAGES))
    imported = {t for m, ts in graph.items() if m.split(".")[0] == "toolbox" for t in ts if t.startswith("toolbox_train")}
    listed = set(re.findall(r"^- `(toolbox_train[\w.]*)`", section("What the host imports from the training package"), re.M))
    assert listed == imported, f"the page lists {sorted(listed)}; toolbox/ imports {sorted(imported)}"
    back = {m for m, ts in graph.items() if m.startswith("toolbox_train") for t in ts if t.split(".")[0] == "toolbox"}
    assert not back, f"the image's package imports the host's: {sorted(back)}"


def guard_functions(cli: Path) -> set[str]:
    """The functions of toolbox_train/contract.py that catch every exception (`except Exception`),
    or call one that does: the guard, whatever its name."""
    funcs = {n.name: n for n in ast.parse(cli.read_text(encoding="utf-8")).body if isinstance(n, ast.FunctionDef)}

    def catches_all(fn: ast.FunctionDef) -> bool:
        return any(isinstance(h, ast.ExceptHandler) and isinstance(h.type, ast.Name) and h.type.id in ("Exception", "BaseException")
                   for h in ast.walk(fn))

    guards = {name for name, fn in funcs.items() if catches_all(fn)}
    grew = True
    while grew:
        grew = False
        for name, fn in funcs.items():
            called = {getattr(c.func, "id", None) for c in ast.walk(fn) if isinstance(c, ast.Call)}
            if name not in guards and called & guards:
                guards.add(name)
                grew = True
    return guards


def script_mains() -> dict[str, tuple[str, ast.FunctionDef]]:
    """{console script of the training package: (its module, its main function)}."""
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    mods = modules(PACKAGES)
    out = {}
    for name, target in sorted(scripts.items()):
        module, func = target.split(":")
        if not module.startswith("toolbox_train"):
            continue
        main = None
        while main is None:  # follow a re-export (`from .cli import main` in a package)
            tree = ast.parse(mods[module].read_text(encoding="utf-8"))
            main = next((n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == func), None)
            if main is None:
                imp = next(n for n in tree.body if isinstance(n, ast.ImportFrom) and func in {a.name for a in n.names})
                package = module if mods[module].name == "__init__.py" else module.rpartition(".")[0]
                base = package.split(".")[: len(package.split(".")) - imp.level + 1] if imp.level else []
                module = ".".join([*base, imp.module] if imp.module else base)
        out[name] = (module, main)
    return out


def test_the_page_says_which_training_commands_return_through_the_one_guard():
    guards = guard_functions(PACKAGES["toolbox_train"] / "contract.py")
    assert guards, "toolbox_train/contract.py has no function that catches every exception"
    guarded = set()
    for name, (_module, main) in script_mains().items():
        called = {getattr(c.func, "id", getattr(c.func, "attr", None)) for c in ast.walk(main) if isinstance(c, ast.Call)}
        if called & guards:
            guarded.add(name)
    errors = section("Errors")
    said = {}
    for label in ("Guarded", "Not yet guarded"):
        m = re.search(rf"^- {label}:(.*?)(?=^- |\Z)", errors, re.M | re.S)
        said[label] = set(re.findall(r"`([a-z-]+)`", m.group(1))) if m else set()
    want_not = set(script_mains()) - guarded
    assert said["Guarded"] == guarded and said["Not yet guarded"] == want_not, (
        f"docs/architecture.md, ## Errors should say: - Guarded: {sorted(guarded)}; - Not yet guarded: {sorted(want_not)}")


def _under(module: str, prefix: str) -> bool:
    return module == prefix or module.startswith(prefix + ".")


def false_boundaries(text: str | None = None) -> list[str]:
    """The lines of ## Boundaries the import graph contradicts (or that state nothing checkable)."""
    graph = import_graph(modules(PACKAGES))
    wrong = []
    for line in re.findall(r"^- (.+)$", section("Boundaries", text), re.M):
        nothing = re.fullmatch(r"`([\w.]+)` imports nothing of `([\w.]+)`(?: \(.*\))?\.?", line)
        only = re.fullmatch(r"of `([\w.]+)`, `([\w.]+)` imports only ((?:`[\w.]+`(?:, )?)+)(?: \(.*\))?\.?", line)
        if nothing:
            a, b = nothing.groups()
            edges = sorted(f"{m} -> {t}" for m, ts in graph.items() if _under(m, a) for t in ts if _under(t, b))
            if edges:
                wrong.append(f"{line}  -- but {', '.join(edges)}")
        elif only:
            b, a, listed = only.groups()
            said = set(re.findall(r"`([\w.]+)`", listed))
            have = {t for m, ts in graph.items() if _under(m, a) for t in ts if _under(t, b)}
            if said != have:
                wrong.append(f"{line}  -- it imports {sorted(have)}")
        else:
            wrong.append(f"{line}  -- not a boundary the test can check")
    return wrong


def test_every_boundary_the_page_states_holds():
    wrong = false_boundaries()
    assert not wrong, "docs/architecture.md, ## Boundaries, contradicted by the import graph:\n" + "\n".join(wrong)


def test_a_false_boundary_is_found():
    text = DOC.read_text(encoding="utf-8")
    false = text.replace("## Boundaries\n", "## Boundaries\n\n- `toolbox.stack` imports nothing of `toolbox.components`.\n"
                         "- of `toolbox_train`, `toolbox.cluster` imports only `toolbox_train.safe_yaml`.\n"
                         "- the stack is read once.\n", 1)
    wrong = false_boundaries(false)
    assert len(wrong) == 3 and "toolbox.stack.load -> toolbox.components" in wrong[0], wrong
    assert "toolbox_train.config.rdma" in wrong[1] and "not a boundary" in wrong[2], wrong


def test_the_page_states_which_of_stack_and_components_is_below():
    # One way between the two folders (tests/test_layout_host.py refuses a folder circle): the
    # components are below the stack, and the page says so in a line the graph is checked against.
    lines = re.findall(r"^- (.+)$", section("Boundaries"), re.M)
    assert any(line.startswith("`toolbox.components` imports nothing of `toolbox.stack` ") for line in lines), lines


def test_the_page_is_one_page():
    # Issue 45: redrawn on one page (235 lines before); a job that needs more has its own doc.
    n = len(DOC.read_text(encoding="utf-8").splitlines())
    assert n < 200, f"docs/architecture.md has {n} lines; one page is under 200"
