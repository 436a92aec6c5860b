"""`toolbox render` and `toolbox context`: a stack's Dockerfile, or its whole build context."""

from __future__ import annotations

import sys
from pathlib import Path

from toolbox.commands.options import add_stack_and_set
from toolbox.files import atomic_write
from toolbox.rendering import render_dockerfile, write_context
from toolbox.stack.load import load_stack


def run_render(args) -> int:
    stack = load_stack(args.stack, args.overrides)
    text = render_dockerfile(stack)
    if args.output:
        atomic_write(Path(args.output), text)
    else:
        sys.stdout.write(text)
    return 0


def run_context(args) -> int:
    stack = load_stack(args.stack, args.overrides)
    dest = write_context(stack, Path(args.output))
    print(dest)
    return 0


def register(sub) -> None:
    p = sub.add_parser("render", help="render a stack's Dockerfile")
    add_stack_and_set(p)
    p.add_argument("--output", "-o", metavar="FILE", help="write here (atomically) instead of stdout")
    p.set_defaults(func=run_render)
    c = sub.add_parser("context", help="write a stack's whole build context into a new folder")
    add_stack_and_set(c)
    c.add_argument("--output", "-o", metavar="DIR", required=True, help="folder to create (must not exist, or be empty)")
    c.set_defaults(func=run_context)
