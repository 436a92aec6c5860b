"""`toolbox lock --stack S`: resolve the stack's whole Python set into <stack>.pylock.txt (uv)."""

from __future__ import annotations

import os
from pathlib import Path

from toolbox.commands.options import add_set, add_stack
from toolbox.errors import UserError


def find_links(given: list[Path]) -> list[Path]:
    """--find-links folders, else pip's PIP_FIND_LINKS folders (where a local torch wheel lives)."""
    if given:
        for d in given:
            if not d.is_dir():
                raise UserError(f"--find-links {d}: not a directory")
        return given
    return [Path(d.removeprefix("file://")) for d in (os.environ.get("PIP_FIND_LINKS") or "").split()
            if Path(d.removeprefix("file://")).is_dir()]


def relock(stack_ref, links: list[Path], upgrade: bool = False, overrides=()) -> Path:
    from toolbox.stack import python_lock
    from toolbox.stack.load import load_stack

    stack = load_stack(stack_ref, overrides)
    # A --set that changes the Python set is locked into the user's state, never the shipped file.
    user = bool(overrides) and python_lock.inputs_digest(stack) != python_lock.inputs_digest(load_stack(stack_ref))
    return python_lock.compile_lock(stack, find_links=find_links(links), upgrade=upgrade, user=user)


def run(args) -> int:
    if args.check:
        from toolbox.stack import python_lock
        from toolbox.stack.load import load_stack

        stack = load_stack(args.stack, args.overrides)
        found = stack.python_lock.whole  # read once by load_stack
        if found is None:
            cmd = " ".join(["toolbox lock --stack", args.stack or stack.model.name, *(f"--set {o}" for o in args.overrides)])
            raise UserError(f"{python_lock.lock_path(stack)}: not made from stack {stack.model.name}'s pins: run `{cmd}`")
        print(f"{found}: current")
        return 0
    out = relock(args.stack, args.find_links, upgrade=args.upgrade, overrides=args.overrides)
    print(out)
    return 0


def register(sub) -> None:
    p = sub.add_parser("lock", help="resolve a stack's whole Python set into its Python lock (uv, every file hashed)")
    add_stack(p)
    add_set(p, "lock this pin set instead: into your state folder, where `build --set` finds it")
    p.add_argument("--find-links", type=Path, action="append", default=[], metavar="DIR",
                   help="folder of local wheels (default: PIP_FIND_LINKS), hashed from the files")
    p.add_argument("--upgrade", action="store_true", help="newest allowed versions of the unpinned dependencies")
    p.add_argument("--check", action="store_true", help="resolve nothing: exit 2 unless the lock matches the pins")
    p.set_defaults(func=run)
