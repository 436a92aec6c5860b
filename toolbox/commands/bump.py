"""`toolbox bump COMPONENT [--to VERSION|REF|latest]`: resolve a release and rewrite the stack's pins."""

from __future__ import annotations

from toolbox.argtypes import http_url, version_or_ref
from toolbox.commands.options import add_stack
from toolbox.errors import ToolError, UserError
from toolbox.stack.bumping import COMPONENTS, bump


def run(args) -> int:
    from toolbox.files import atomic_write
    from toolbox.stack.load import resolve_ref

    path = resolve_ref(args.stack)
    before = path.read_bytes()
    changes = bump(args.component, args.stack, args.to, index_url=args.index_url, registry_url=args.registry_url)
    try:
        _relock(args.stack)
    except BaseException:
        atomic_write(path, before)  # a failed bump leaves the stack as it was, not pins without their lock
        raise
    for k, v in changes.items():
        print(f"{k}: {v}")
    return 0


def _relock(stack_ref) -> None:
    """A stack with a Python lock gets it refreshed for its new pins (toolbox.stack.python_lock)."""
    from toolbox.stack import python_lock
    from toolbox.commands.lock import relock
    from toolbox.stack.load import load_stack

    stack = load_stack(stack_ref)
    if python_lock.lock_path(stack).is_file() and stack.python_lock.whole is None:
        try:
            print(f"python lock: {relock(stack_ref, [])}")
        except (ToolError, UserError) as exc:
            raise ToolError(f"{stack.source} left as it was: uv could not lock the new pins into "
                            f"{python_lock.lock_path(stack)} ({str(exc).splitlines()[0]})") from None


def register(sub) -> None:
    p = sub.add_parser("bump", help="resolve a new release of a component and rewrite the stack's pins")
    p.add_argument("component", choices=COMPONENTS)
    add_stack(p, "the one to edit; default {default}")
    p.add_argument("--to", type=version_or_ref, metavar="VERSION|REF|latest", default=None,
                   help="a version, git ref or image tag")
    p.add_argument("--index-url", type=http_url, default=None, help="rocm: the tarball index page (default: the pinned URL's folder); torch: the pip index (default torch.index_url)")
    p.add_argument("--registry-url", type=http_url, default=None, help="base: registry base URL (default https://<registry host>)")
    p.set_defaults(func=run)
