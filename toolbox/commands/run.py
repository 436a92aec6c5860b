"""`toolbox run`: run a command in a stack's image with what the stack needs."""

from __future__ import annotations

import os
from pathlib import Path

from toolbox.argtypes import container_name, image_ref, network_mode
from toolbox.commands.options import add_set, add_stack
from toolbox.errors import ToolError, UserError


def register(sub) -> None:
    p = sub.add_parser("run", help="run CMD in a stack's image (GPU devices, mounts, env by name)")
    add_target_args(p)
    p.add_argument("--engine", choices=["podman", "docker", "toolbx", "distrobox"],
                   help="default: podman if installed, else Docker; toolbx/distrobox run CMD in the "
                   "existing container named by --name")
    p.add_argument("--name", type=container_name, help="container name (the existing container for toolbx/distrobox)")
    p.add_argument("--mount", action="append", default=[], metavar="SRC:DST[:ro]", help="extra bind mount")
    p.add_argument("--workspace", type=Path, help="host folder mounted at /workspace (default: current folder)")
    p.add_argument("--hf-cache", type=Path, help="host Hugging Face cache mounted at /hf-cache "
                   "(default: $HF_HOME or ~/.cache/huggingface)")
    p.add_argument("--network", type=network_mode, metavar="MODE", help="container network, e.g. host (multi-node)")
    p.add_argument("--host-network", action="store_const", const="host", dest="network",
                   help="same as --network host")
    p.add_argument("--env", action="append", default=[], metavar="NAME",
                   help="also pass this host variable by name (HF_TOKEN and the like are passed already)")
    p.add_argument("--dry-run", action="store_true", help="print the engine command, shell-quoted")
    p.add_argument("cmd", nargs="*", metavar="-- CMD", help="the command to run in the container")
    p.set_defaults(func=run)


def add_target_args(p) -> None:
    add_stack(p)
    add_set(p, "selects the image of that pin set")
    p.add_argument("--image", type=image_ref, help="image reference (default: the stack's default tag)")
    p.add_argument("--platform", choices=["rocm", "cuda", "cpu"],
                   help="GPU kind of --image (default: the stack's, or the image's label)")


def resolve_target(args, engine=None) -> tuple[str, str, object | None]:
    """(image, platform, stack or None); ENGINE (an available ImageEngine) reads an image's
    stack label when only --image is given."""
    from toolbox.components.labels import LABEL_PREFIX
    from toolbox.run_options import default_tag
    from toolbox.stack.load import load_stack

    stack = None
    if args.image and not args.stack and not args.overrides:
        image = args.image
        platform = args.platform
        if platform is None and engine is not None:
            try:
                info = engine.image_info(image)
            except ToolError:
                info = None
            name = ((info or {}).get("labels") or {}).get(LABEL_PREFIX + "stack")
            if name:
                try:
                    stack = load_stack(name)
                    platform = stack.model.platform
                except UserError:
                    stack = None
        if platform is None:
            raise UserError(f"--image {image}: cannot tell its platform; pass --stack or --platform rocm|cuda|cpu")
    else:
        stack = load_stack(args.stack, args.overrides)
        image = args.image or default_tag(stack)
        platform = args.platform or stack.model.platform
    return image, platform, stack


def run(args) -> int:
    from toolbox.engines import ImageEngine, get_engine, quote, require
    from toolbox.run_options import check_rocm_host, run_spec

    cmd = list(args.cmd)
    if cmd and cmd[0] == "--":
        cmd = cmd[1:]
    if not cmd:
        raise UserError("toolbox run: give the command after `--`, e.g. toolbox run -- finetune --config train.yaml")
    engine = get_engine(args.engine)
    # podman/Docker run a throw-away container of the image; toolbx/distrobox enter --name's
    images = engine if isinstance(engine, ImageEngine) else None
    image, platform, _stack = resolve_target(args, images if images and images.available() else None)
    if args.workspace is not None and not args.workspace.is_dir():
        raise UserError(f"--workspace {args.workspace}: not a directory")
    if args.hf_cache is not None and args.hf_cache.exists() and not args.hf_cache.is_dir():
        raise UserError(f"--hf-cache {args.hf_cache}: not a directory")
    spec = run_spec(
        engine=engine.name, platform=platform, image=image, command=cmd, name=args.name,
        workspace=args.workspace, mounts=args.mount, network=args.network, extra_env=args.env,
        hf_cache=args.hf_cache, create_cache=not args.dry_run,
    )
    if images is not None:
        spec.tty = os.isatty(0) and os.isatty(1)
    if args.dry_run:
        if platform == "rocm" and not os.path.exists("/dev/kfd"):
            print("# warning: /dev/kfd does not exist on this host; the real run would stop here")
        print(quote(engine.run_command(spec)))
        return 0
    require(engine)
    if images is not None:
        if platform == "rocm":
            check_rocm_host()
        if images.image_info(image) is None:
            raise ToolError(f"image {image} not found in {engine.name}: build it first with "
                            f"`toolbox build{' --stack ' + args.stack if args.stack else ''}`")
    return engine.run(spec)
