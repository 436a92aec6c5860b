"""`toolbox create`: a long-lived toolbx or distrobox container from a stack's image."""

from __future__ import annotations

import os
import subprocess

from toolbox.errors import ToolError, UserError


def register(sub) -> None:
    from toolbox.argtypes import container_name, renamed
    from toolbox.commands.run import add_target_args

    p = sub.add_parser("create", help="create a long-lived toolbx or distrobox container of a stack's image")
    add_target_args(p)
    p.add_argument("--engine", choices=["toolbx", "distrobox"], default="distrobox",
                   help="which tool keeps the container (default distrobox)")
    renamed(p, "--via", "--engine")
    p.add_argument("--name", type=container_name, help="container name (default toolbox-STACK)")
    p.add_argument("--dry-run", action="store_true", help="print the command(s), shell-quoted")
    p.set_defaults(func=run)


def run(args) -> int:
    from toolbox.commands.run import resolve_target
    from toolbox.engines import RunSpec, get_engine, quote
    from toolbox.run_options import gpu_options

    image, platform, stack = resolve_target(args)
    name = args.name or f"toolbox-{stack.model.name if stack else 'image'}"
    if not name.replace("-", "a").replace("_", "a").replace(".", "a").isalnum():
        raise UserError(f"--name {name!r}: use letters, digits, '-', '_' or '.'")
    engine = get_engine(args.engine)
    spec = RunSpec(image=image, command=[], name=name)
    # distrobox runs as the user on rootless podman (it refuses root); toolbx takes no flags
    gpu_options(platform, spec, rootless=os.geteuid() != 0)
    cmds = engine.create_commands(name, image, spec)
    if args.dry_run:
        if platform == "rocm" and not os.path.exists("/dev/kfd"):
            print("# warning: /dev/kfd does not exist on this host; the container would see no GPU")
        for argv in cmds:
            print(quote(argv))
        return 0
    engine.check_user()
    if not engine.available():
        raise ToolError(f"{engine.name} is not available: {engine.missing_hint()}")
    if platform == "rocm" and not os.path.exists("/dev/kfd"):
        raise ToolError("this is a ROCm stack but /dev/kfd does not exist on this host: load the amdgpu "
                        "driver, or create a CPU stack's container (`--stack cpu`)")
    for argv in cmds:
        rc = subprocess.call(argv)
        if rc != 0:
            raise ToolError(f"`{quote(argv)}` exited {rc}")
    print(f"created {name}; enter it with: "
          + ("toolbox enter " + name if engine.name == "toolbx" else f"distrobox enter {name}")
          + f"  (or: python -m toolbox run --engine {engine.name} --name {name} -- CMD)")
    return 0
