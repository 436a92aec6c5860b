"""A component is one entry (issue 45): its lifecycle hooks (lock, bump, first-use pins) and its
exported values live in its module, and the generic modules that ask them name none.

- The generic modules (stack.bumping, stack.pinning, stack.python_lock, stack.load, rendering)
  dispatch on no component: no component's name compared, used as a key or attribute name, no
  block read off the stack model, no component module imported (an AST check; messages and
  docstrings may name one). stack.releases (AMD's release indexes, which the rocm and torch bump
  hooks reach through bumping's tools) is not generic; stack.model runs the components' `checks`
  but keeps the platform's own rule (platform rocm needs a `rocm:` block and gpu_targets).
- A template reads its own component's block and variables, the stack's own fields and `exports`,
  never another component's block or variables.
- A component module added beside the others, in a folder of its own (the package's path
  extended, in a fresh process), is picked up by the pins, the first-use pins, the Python lock,
  `toolbox bump`, the stack's checks and render, with no other module edited.
"""

from __future__ import annotations

import ast
import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

from toolbox import components

ROOT = Path(__file__).resolve().parents[1]
GENERIC = ["toolbox/stack/bumping.py", "toolbox/stack/pinning.py", "toolbox/stack/python_lock.py",
           "toolbox/stack/load.py", "toolbox/rendering.py"]


def component_names() -> set[str]:
    """Every component's name, block key and bump target."""
    return {n for c in components.registry() for n in (c.name, c.block_key, *c.bumps)}


def dispatches(source: str, names: set[str]) -> list[str]:
    """Where a module dispatches on a component by name: its name as a string compared (==, !=,
    in), a subscript or dict key, a call's argument (getattr(model, "rocm"), inputs_digest(s, "torch"));
    its block read off a stack model (`.model.<key>`); a component module imported."""
    found = []

    def lit(node) -> bool:
        return isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in names

    def each(node):
        return node.elts if isinstance(node, (ast.Tuple, ast.List, ast.Set)) else [node]

    for node in ast.walk(ast.parse(source)):
        where = getattr(node, "lineno", "?")
        if isinstance(node, ast.Compare):
            found += [f"{where}: compares {e.value!r}" for n in (node.left, *node.comparators) for e in each(n) if lit(e)]
        elif isinstance(node, ast.Subscript) and lit(node.slice):
            found.append(f"{where}: [{node.slice.value!r}]")
        elif isinstance(node, ast.Dict):
            found += [f"{where}: key {k.value!r}" for k in node.keys if k is not None and lit(k)]
        elif isinstance(node, ast.Call):
            args = [*node.args, *(k.value for k in node.keywords)]
            found += [f"{where}: argument {a.value!r}" for a in args if lit(a)]  # (an argv list's words are not)
        elif isinstance(node, ast.Attribute) and node.attr in names and isinstance(node.value, ast.Attribute) \
                and node.value.attr == "model":
            found.append(f"{where}: .model.{node.attr}")
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            mods = [a.name for a in node.names] if isinstance(node, ast.Import) else [
                f"{node.module}.{a.name}" for a in node.names]
            found += [f"{where}: imports {m}" for m in mods
                      if m.startswith("toolbox.components.") and m.split(".")[2] in names]
    return found


def test_the_generic_modules_name_no_component():
    names = component_names()
    assert {"rocm", "torch", "rccl", "bitsandbytes", "unsloth", "unsloth_zoo", "therock", "base", "ray"} <= names
    wrong = {path: hits for path in GENERIC if (hits := dispatches((ROOT / path).read_text(encoding="utf-8"), names))}
    assert not wrong, wrong


def test_the_check_finds_a_component_named():
    # A check that cannot fail proves nothing: the if/elif of bumping.py before issue 45, and the
    # reads of python_lock.py, are found.
    old = textwrap.dedent('''
        from toolbox.components import torch
        from toolbox.components.unsloth import left_out
        GIT_FIELDS = {"rccl": ("rccl", "repo", "commit")}
        def bump(component, stack):
            if component == "rocm":
                index = stack.model.rocm.tarball.url
            elif component in ("torch", "base"):
                pass
            return inputs_digest(stack, "torch"), getattr(stack.model, "ray", None), GIT_FIELDS[component]
    ''')
    found = dispatches(old, component_names())
    kinds = " | ".join(found)
    for want in ("imports toolbox.components.torch", "imports toolbox.components.unsloth", "key 'rccl'",
                 "compares 'rocm'", "compares 'torch'", "compares 'base'", ".model.rocm", "argument 'torch'",
                 "argument 'ray'"):
        assert want in kinds, (want, found)


OWN_STACK_FIELDS = {"name", "description", "platform", "gpu_targets"}  # the stack's own, not a block's
STACK_PROPERTIES = {"base_image": "base", "rccl_targets": "rccl"}  # the Stack's, of one block each


def block_reads(text: str, owner: components.Component | None) -> list[str]:
    """What a template (of `owner`, None: render's own) reads of another component's block."""
    mine = set() if owner is None else {owner.block_key}
    text = " ".join(re.findall(r"\{\{.*?\}\}|\{%.*?%\}", text, re.S))  # jinja's, not the Dockerfile's words
    wrong = [f"stack.model.{b}" for b in re.findall(r"\bstack\.model\.(\w+)", text) if b not in mine | OWN_STACK_FIELDS]
    for prop in re.findall(r"\bstack\.(\w+)", text):
        if prop != "model" and (owner is None or STACK_PROPERTIES.get(prop) != owner.name):
            wrong.append(f"stack.{prop}")
    return wrong


def templates() -> dict[str, components.Component | None]:
    """Every template under dockerfiles/ and the component it belongs to (None: render's own)."""
    from toolbox.stack.load import load_stack

    owner: dict[str, components.Component | None] = {"Dockerfile.j2": None, "stages/devel.j2": None}
    stacks = [load_stack(n) for n in ("cpu", "gfx1151", "gfx1151-rocm10.0")]
    for c in components.registry():
        for t in (c.builder, c.runtime):
            if t:
                owner[t] = c
        for s in stacks:
            if c.applies(s):
                owner.update({f.template: c for f in c.context(s) if f.template})
    return owner


def foreign_variables(text: str, owner: components.Component | None, own: set[str]) -> list[str]:
    """The template variables a template (of `owner`, None: render's own) uses that are neither its
    component's variables (`own`) nor render's own (`stack`, `exports`, ...)."""
    import jinja2.meta

    from toolbox import rendering

    used = jinja2.meta.find_undeclared_variables(rendering._env().parse(text))
    return sorted(used - (own if owner is not None else set()) - rendering.RESERVED)


def test_a_template_reads_another_component_only_through_its_exports():
    owners = templates()
    on_disk = {p.relative_to(ROOT / "dockerfiles").as_posix() for p in (ROOT / "dockerfiles").rglob("*.j2")}
    assert set(owners) == on_disk, set(owners) ^ on_disk
    wrong = {t: r for t, c in owners.items() if (r := block_reads((ROOT / "dockerfiles" / t).read_text(), c))}
    assert not wrong, f"templates reading another component's block (use its exports): {wrong}"
    # nor another component's template variables (their names are one flat namespace)
    from toolbox.stack.load import load_stack

    own: dict[str, set[str]] = {}
    for s in (load_stack(n) for n in ("cpu", "cuda", "gfx1151", "gfx1151-rocm10.0")):
        for c in components.active(s):
            own.setdefault(c.name, set()).update(c.variables(s, s.pin_set))
    wrong = {t: r for t, c in owners.items()
             if (r := foreign_variables((ROOT / "dockerfiles" / t).read_text(), c, own.get(getattr(c, "name", ""), set())))}
    assert not wrong, f"templates reading another component's variables (use its exports): {wrong}"
    # and the checks see one: torch's step reading ROCm's prefix off its block, render's stage the
    # base's, hf's step torch's variable
    torch = next(c for c in components.registry() if c.name == "torch")
    assert block_reads("find {{ stack.model.rocm.prefix }}/ -name x", torch) == ["stack.model.rocm"]
    hf = next(c for c in components.registry() if c.name == "hf")
    assert foreign_variables("{% for r in hf_reqs + torch_reqs %}{{ r }}{% endfor %}", hf, own["hf"]) == ["torch_reqs"]
    assert block_reads("FROM {{ stack.base_image }}", None) == ["stack.base_image"]


TINY = '''
"""A component the test adds: one module, every hook."""
from typing import Optional

from pydantic import Field

from toolbox.components import Component, ContextFile, LockPart, Model
from toolbox.components.values import FieldError


class Tiny(Model):
    version: str = Field(description="tiny's version")
    sha256: Optional[str] = Field(None, description="pinned on first use")


def _first_use(stack, pin):
    if stack.model.tiny.sha256 is not None:
        return []
    pin.loud("tiny: sha256 taken by the test")
    return [(("tiny", "sha256"), "c" * 64)]


def _checks(model):
    if model.tiny.version == "0" and model.platform == "cpu":
        raise FieldError(("tiny", "version"), "tiny 0 never ran on cpu")


COMPONENT = Component(
    "tiny", place=95, block=Tiny, field=Field(None, description="the test's component"),
    applies=lambda s: s.model.tiny is not None,
    pins=lambda s: {"tiny.version": s.model.tiny.version, "tiny.sha256": s.model.tiny.sha256 or "unverified"},
    runtime="runtime/tiny.j2", variables=lambda s, pin_set: {"tiny_version": s.model.tiny.version},
    context=lambda s: [ContextFile("tiny/README", text="tiny " + s.model.tiny.version)],
    exports=lambda s: {"home": "/opt/tiny"},
    lock=lambda s: LockPart(requirements=(f"tinypkg=={s.model.tiny.version}",)),
    bumps={"tiny": lambda stack, to, tools: {"tiny.version": to}},
    first_use_pins=_first_use, checks=_checks,
)
'''

SCRIPT = '''
import json, sys
from pathlib import Path

tmp = Path(sys.argv[1])
import toolbox.components
toolbox.components.__path__.append(str(tmp / "more"))  # the new module's folder, before anything loads
from toolbox import rendering
rendering.TEMPLATES = tmp / "dockerfiles"  # dockerfiles/ copied, plus the new component's template
from toolbox.stack import pinning, python_lock
from toolbox.stack.bumping import COMPONENTS, bump
from toolbox.stack.load import load_stack

path = str(tmp / "tiny.yaml")
pins_file = pinning.PinsFile(tmp / "pins.lock.json")
stack = load_stack(path, first_use=lambda s: pinning.first_use_pins(s, frozen=True, pins_file=pins_file))
rendering.write_context(stack, tmp / "ctx")
out = {"pins": stack.pins(), "requirements": python_lock.requirements(stack), "targets": COMPONENTS,
       "dockerfile": (tmp / "ctx" / "Dockerfile").read_text(), "context": (tmp / "ctx" / "tiny" / "README").read_text(),
       "bump": None}
try:
    load_stack(path, ["tiny.version=0"])
except Exception as exc:
    out["check"] = f"{type(exc).__name__}: {exc}"
out["bump"] = bump("tiny", path, "2.0")
out["after"] = load_stack(path).model.tiny.version
print(json.dumps(out))
'''


def test_a_new_component_is_one_entry(tmp_path):
    (tmp_path / "more").mkdir()
    (tmp_path / "more" / "tiny.py").write_text(TINY)
    shutil.copytree(ROOT / "dockerfiles", tmp_path / "dockerfiles")
    (tmp_path / "dockerfiles" / "runtime" / "tiny.j2").write_text(
        "# tiny {{ tiny_version }} in {{ exports.tiny.home }}, on {{ exports.base.family }}\n"
        "RUN mkdir -p {{ exports.tiny.home }}\n")
    (tmp_path / "tiny.yaml").write_text('extends: cpu\nname: tiny-test\ntiny:\n  version: "1.0"\n')
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{ROOT / 'entrypoints'}",
           "TOOLBOX_STATE_DIR": str(tmp_path / "state"), "TOOLBOX_CACHE_DIR": str(tmp_path / "cache")}
    cp = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path)], capture_output=True, text=True,
                        env=env, timeout=300, cwd=ROOT)
    assert cp.returncode == 0, cp.stderr
    out = json.loads(cp.stdout)
    # first-use pin taken before the pins were collected; the pins, the image tag's input
    assert out["pins"]["tiny.version"] == "1.0" and out["pins"]["tiny.sha256"] == "c" * 64
    assert "PINNED ON FIRST USE: tiny: sha256 taken by the test" in cp.stderr
    assert "tinypkg==1.0" in out["requirements"]  # the Python lock's input
    assert "tiny" in out["targets"] and out["bump"] == {"tiny.version": "2.0"} and out["after"] == "2.0"
    step = "# tiny 1.0 in /opt/tiny, on debian\nRUN mkdir -p /opt/tiny\n"
    assert step in out["dockerfile"], out["dockerfile"]
    # in image order: after the entrypoints (place 90), before the labels (110)
    assert out["dockerfile"].index("/opt/toolbox/entrypoints") < out["dockerfile"].index(step) \
        < out["dockerfile"].index("LABEL")
    assert out["context"] == "tiny 1.0"
    assert out["check"] == "UserError: --set tiny.version=0: tiny.version: tiny 0 never ran on cpu", out["check"]
    assert "tiny" not in component_names()  # this process's registry: the module was the subprocess's
