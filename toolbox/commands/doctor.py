"""`toolbox doctor`: is this host / image fit to train? Exits 1 with fix hints when not.

Outside a container it checks the engine, the GPU device nodes, and the image's labels
against the stack's pins, then (with --in-image) runs the probe inside the image.
Inside a container it runs the probe (toolbox_train.commands.health) directly.
"""

from __future__ import annotations

import json
import os
import sys

from toolbox.components.labels import LABEL_PREFIX
from toolbox.errors import ToolError, UserError


def register(sub) -> None:
    from toolbox.argtypes import container_name, network_mode
    from toolbox.commands.run import add_target_args

    p = sub.add_parser("doctor", help="check engine, GPU, image labels vs stack pins; in-container probe")
    add_target_args(p)
    p.add_argument("--engine", choices=["podman", "docker", "toolbx", "distrobox"],
                   help="toolbx/distrobox: check the container named by --name")
    p.add_argument("--name", type=container_name, help="the toolbx/distrobox container to check")
    p.add_argument("--network", type=network_mode, metavar="MODE", help="container network of the --in-image probe (podman/Docker)")
    p.add_argument("--in-image", action="store_true", help="also run the probe inside the image")
    p.add_argument("--gpu-only", action="store_true",
                   help="only the host's GPU: /dev/kfd and render-node access, and on a gfx1151 host the "
                        "GPU-visible memory, kernel and MES firmware (no engine or image needed)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=run)


def in_container() -> bool:
    # Inside one of our images (its lock is baked in), not just any container: a
    # developer's machine may itself be a container with podman in it.
    return os.environ.get("TOOLBOX_IN_IMAGE") == "1" or os.path.exists("/opt/toolbox/stack.lock.yaml")


def label_checks(labels: dict, stack) -> list:
    from toolbox_train.commands.health import Check

    out = []
    lock = stack.pins()
    if labels.get(LABEL_PREFIX + "stack") != stack.model.name:
        out.append(Check("label stack", "fail", f"image says {labels.get(LABEL_PREFIX + 'stack')!r}, stack is {stack.model.name!r}",
                         f"build the image of this stack: toolbox build --stack {stack.model.name}"))
    want_digest = stack.digest()
    have_digest = labels.get(LABEL_PREFIX + "lock-digest")
    out.append(Check("label lock-digest", "ok" if have_digest == want_digest else "fail",
                     f"image {have_digest}, stack {want_digest}",
                     "" if have_digest == want_digest else f"rebuild: toolbox build --stack {stack.model.name}"))
    bad = []
    for key, want in lock.items():
        have = labels.get(LABEL_PREFIX + key)
        if have != str(want):
            bad.append(f"{key}: image {have!r} != stack {want!r}")
    out.append(Check("label pins", "fail" if bad else "ok",
                     "; ".join(bad[:8]) + (f" (+{len(bad) - 8} more)" if len(bad) > 8 else "") if bad
                     else f"all {len(lock)} pins match",
                     f"rebuild: toolbox build --stack {stack.model.name}" if bad else ""))
    return out


def host_checks(args):
    from toolbox import gpuhost
    from toolbox.commands.run import resolve_target
    from toolbox.engines import ContainerEngine, ImageEngine, get_engine
    from toolbox_train.commands.health import Check

    checks = []
    try:
        engine = get_engine(args.engine)
        ok = engine.available()
        checks.append(Check("engine", "ok" if ok else "fail", engine.name + ("" if ok else " not usable"),
                            "" if ok else engine.missing_hint()))
    except (ToolError, UserError) as exc:
        engine = None
        checks.append(Check("engine", "fail", "no container engine", str(exc)))
    if isinstance(engine, ContainerEngine):
        return container_checks(args, engine, checks)
    images = engine if isinstance(engine, ImageEngine) and engine.available() else None
    image, platform, stack = resolve_target(args, images)
    # /dev/kfd and render nodes (ROCm stacks), and on a gfx1151 host what Strix Halo users trip on
    checks += gpuhost.gpu_checks(rocm=platform == "rocm")
    info = None
    if engine is not None and engine.available():
        info = engine.image_info(image)
        if info is None:
            checks.append(Check("image", "fail", f"{image} not found in {engine.name}",
                                f"toolbox build{' --stack ' + args.stack if args.stack else ''}"))
        else:
            checks.append(Check("image", "ok", f"{image} ({info['id'][:12]})"))
            if stack is not None:
                checks += label_checks(info.get("labels") or {}, stack)
    return checks, engine, image, platform, stack, info


def container_checks(args, engine, checks):
    """toolbx/distrobox: the tool, the user it accepts, the container --name and its labels."""
    from toolbox.commands.run import resolve_target
    from toolbox.stack.load import load_stack
    from toolbox_train.commands.health import Check

    try:
        engine.check_user()
    except UserError as exc:
        checks.append(Check("user", "fail", str(exc).split(";")[0], str(exc)))
    labels = None
    if not args.name:
        checks.append(Check("container", "fail", "no --name given", f"pass --name C (`toolbox create --engine {engine.name}` made it)"))
    elif engine.available():
        labels = engine.container_labels(args.name)
        checks.append(Check("container", "fail" if labels is None else "ok",
                            f"{args.name} " + ("not found" if labels is None else "exists"),
                            f"toolbox create --engine {engine.name} --name {args.name}" if labels is None else ""))
    stack_name = (labels or {}).get(LABEL_PREFIX + "stack")
    if not args.stack and not args.image and stack_name:
        stack = load_stack(stack_name)  # the container's own stack
        image, platform = args.name, stack.model.platform
    else:
        image, platform, stack = resolve_target(args)
    if labels is not None and stack is not None:
        checks += label_checks(labels, stack)
    return checks, engine, image, platform, stack, labels


def report(checks, as_json: bool, what: str) -> int:
    """Print CHECKS (or their JSON); 1 when any failed."""
    from toolbox_train.commands import health as probe

    failed = [c for c in checks if c.status == "fail"]
    if as_json:
        print(json.dumps({"ok": not failed, "checks": [c.__dict__ for c in checks]}, indent=1))
    else:
        print(probe.render(checks))
        print(f"doctor: {what} checks passed" if not failed else f"doctor: {what} problems found (see fix: lines)")
    return 1 if failed else 0


def run(args) -> int:
    from toolbox_train.commands import health as probe

    if in_container():
        argv = ["--json"] if args.json else []
        if args.platform:
            argv += ["--expect-platform", args.platform]
        return probe.main(argv)
    if args.gpu_only:
        if args.in_image:
            raise UserError("--gpu-only checks the host alone: not with --in-image")
        from toolbox import gpuhost

        return report(gpuhost.gpu_checks(), args.json, "host GPU")
    checks, engine, image, platform, stack, info = host_checks(args)
    rc = report(checks, args.json, "host")
    if args.in_image and info is not None:
        from toolbox.run_options import check_rocm_host, run_spec

        if platform == "rocm":
            check_rocm_host()
        cmd = ["python", "-m", "toolbox_train.commands.health", "--expect-platform", platform]
        for t in (stack.model.gpu_targets if stack is not None else []):
            cmd += ["--gpu-target", t]
        if args.json:
            cmd.append("--json")
        spec = run_spec(engine=engine.name, platform=platform, image=image, command=cmd,
                        name=args.name, network=args.network)
        sys.stdout.flush()
        rc = max(rc, engine.run(spec))
    return rc
