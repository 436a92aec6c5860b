"""`toolbox build`: render a stack's build context and build it with podman or Docker."""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path

from toolbox.argtypes import image_ref, network_mode
from toolbox.commands.options import add_set, add_stack
from toolbox.errors import ToolError, UserError
from toolbox_train.sizes import human_size


def register(sub) -> None:
    p = sub.add_parser("build", help="render a stack and build its image (podman or Docker)")
    add_stack(p)
    add_set(p)
    p.add_argument("--engine", choices=["podman", "docker"], help="default: podman if installed, else Docker")
    p.add_argument("--tag", type=image_ref, help="image tag (default localhost/toolbox-STACK:DIGEST)")
    p.add_argument("--target", help="build only up to this Dockerfile stage")
    p.add_argument("--no-cache", action="store_true", help="do not reuse cached layers")
    p.add_argument("--ca-bundle", type=Path, metavar="FILE",
                   help="CA bundle for pip/dnf/apt in RUN steps, passed as build secret `ca` (never a layer)")
    p.add_argument("--wheelhouse", type=Path, metavar="DIR",
                   help="folder of wheels pip may install from (find-links), e.g. for air-gapped hosts")
    p.add_argument("--network", type=network_mode, metavar="MODE", help="network mode of RUN steps (e.g. host)")
    p.add_argument("--context", type=Path, metavar="DIR",
                   help="write the build context here and keep it (default: a temporary folder)")
    p.add_argument("--allow-unverified", action="store_true", help="build even with pins marked unverified")
    p.add_argument("--frozen", action="store_true",
                   help="refuse what is not pinned yet (no first-use pinning; for CI and releases)")
    p.add_argument("--unlocked", action="store_true",
                   help="build although the stack's Python lock is for other pins (those install unhashed)")
    p.add_argument("--dry-run", action="store_true", help="print the engine commands, shell-quoted; build nothing")
    p.set_defaults(func=run)


def _check_inputs(args) -> None:
    if args.ca_bundle is not None:
        f = args.ca_bundle.expanduser()
        if not f.is_file():
            raise UserError(f"--ca-bundle {args.ca_bundle}: no such file")
        if not os.access(f, os.R_OK):
            raise UserError(f"--ca-bundle {args.ca_bundle}: not readable")
        if b"BEGIN CERTIFICATE" not in f.read_bytes()[:1 << 20]:
            raise UserError(f"--ca-bundle {args.ca_bundle}: not a PEM bundle (no BEGIN CERTIFICATE)")
    if args.wheelhouse is not None:
        d = args.wheelhouse.expanduser()
        if not d.is_dir():
            raise UserError(f"--wheelhouse {args.wheelhouse}: not a directory")
        if not any(d.glob("*.whl")):
            raise UserError(f"--wheelhouse {args.wheelhouse}: holds no *.whl files")
    if args.context is not None and args.context.exists() and (not args.context.is_dir() or any(args.context.iterdir())):
        raise UserError(f"--context {args.context}: exists and is not an empty folder")


def _fill_wheelhouse(src: Path, ctx: Path) -> None:
    dest = ctx / "wheelhouse"
    dest.mkdir(exist_ok=True)
    for whl in sorted(src.expanduser().glob("*.whl")):
        target = dest / whl.name
        try:
            os.link(whl, target)  # same filesystem: no copy of a multi-GB wheel
        except OSError:
            shutil.copy2(whl, target)


def run(args) -> int:
    from toolbox.engines import BuildSpec, get_engine, quote, require
    from toolbox.rendering import write_context
    from toolbox.run_options import default_tag
    from toolbox.stack.load import load_stack

    from toolbox.stack import pinning, python_lock

    engine = lock_warning = None

    def first_use(stack):
        """Once the stack is validated and its Python lock read, before its pins are collected."""
        nonlocal engine, lock_warning
        _check_inputs(args)
        # A stale Python lock: exit 2 before anything is fetched (its warnings come after pinning's lines).
        if args.frozen and args.unlocked:
            raise UserError("--unlocked builds without the Python lock's hashes: not with --frozen")
        lock_warning = python_lock.check(stack, args.stack, args.overrides, unlocked=args.unlocked)
        engine = get_engine(args.engine)
        if args.allow_unverified and not args.frozen:
            return []
        # The ROCm tarball's sha256 / base digest: from the user's pins file, else fetched once now.
        return pinning.first_use_pins(stack, frozen=args.frozen, engine=engine.name, ca_bundle=args.ca_bundle)

    # Resolved once, with the typed first-use pins: the files and --set are not read again.
    stack = load_stack(args.stack, args.overrides, first_use=first_use)
    unverified = stack.unverified_pins()
    if unverified and (args.frozen or not args.allow_unverified):
        raise UserError(
            f"stack {stack.model.name}: pins marked unverified: {', '.join(unverified)}; verify them "
            "(`toolbox bump`/hashes) or pass --allow-unverified" + (" (not with --frozen)" if args.frozen else "")
        )
    tag = args.tag or default_tag(stack)
    if lock_warning:
        print(lock_warning, file=sys.stderr)

    if args.context is not None:
        ctx_parent, keep = args.context.resolve(), True  # an empty folder: write_context replaces it whole
    else:
        keep = bool(args.dry_run)  # a dry run's commands must stay runnable
        ctx_parent = Path(tempfile.mkdtemp(prefix=f"toolbox-{stack.model.name}-")) / "context"
    ctx = write_context(stack, ctx_parent)
    if args.wheelhouse is not None:
        _fill_wheelhouse(args.wheelhouse, ctx)
    secrets = {"ca": args.ca_bundle.expanduser().resolve()} if args.ca_bundle else {}
    spec = BuildSpec(context=ctx, tag=tag, target=args.target, no_cache=args.no_cache,
                     network=args.network, secrets=secrets)
    try:
        if args.dry_run:
            print(f"# context: {ctx}")
            if args.context is None:  # dry runs say what they leave behind
                print(f"toolbox: dry run: the build context stays in {ctx.parent} for these commands; "
                      f"remove it when done (--context DIR puts it where you choose)", file=sys.stderr)
            print("IIDFILE=$(mktemp)")
            for argv in engine.build_commands(spec):
                print(quote(argv).replace("'$IIDFILE'", '"$IIDFILE"').replace("'$(cat $IIDFILE)'", '"$(cat "$IIDFILE")"'))
            return 0
        require(engine)
        print(f"toolbox: building {tag} from stack {stack.model.name} with {engine.name} (context {ctx})", flush=True)

        def sink(line: str) -> None:
            sys.stdout.write(line + "\n")
            sys.stdout.flush()

        result = engine.build(spec, sink)
    finally:
        if not keep:
            shutil.rmtree(ctx.parent if args.context is None else ctx, ignore_errors=True)
    print()
    print(f"image:  {result.tag}")
    print(f"id:     {result.image_id[:12]}")
    print(f"size:   {human_size(result.size)}")
    print(f"stack:  {stack.model.name} (digest {stack.digest()})")
    print("pins:")
    for key, value in stack.pins().items():
        print(f"  {key} = {value}")
    return 0
