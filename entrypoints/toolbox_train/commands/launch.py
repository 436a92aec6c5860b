"""`launch --strategy ddp|fsdp [...] -- finetune --config train.yaml [...]`.

Checks the training config for the world size it will run at, writes the accelerate config
for the strategy into `<output.dir>/launch/`, sets the network environment for multi-node
runs, prints what it resolved, then runs `accelerate launch` (torchrun underneath).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

from toolbox_train.commands import finetune
from toolbox_train.planning import preflight
from toolbox_train.config import rdma
from toolbox_train.contract import Terminated, ToolError, UserError, command_parser, renamed, run_command
from toolbox_train.disk import atomic_write
from toolbox_train.planning.inputs import LAUNCH_DIR
from toolbox_train.planning.run import FINISHED, FINISHED_ENV, resolve as resolve_run
from toolbox_train.config.sync import ENV as SYNC_ENV, parse_sync

HERE = Path(__file__).resolve().parents[1]  # the toolbox_train package: accelerate/ is its data


def shipped_config(name: str) -> Path:
    for d in (HERE / "accelerate", HERE.parent / "accelerate"):
        if (d / name).is_file():
            return d / name
    raise ToolError(f"shipped accelerate config {name} not found next to {HERE}")


def interface_for(addr: str) -> str:
    """The local interface whose address the kernel picks to reach `addr`."""
    import psutil

    try:
        ip = socket.gethostbyname(addr)
    except OSError as exc:
        raise UserError(f"--master-addr {addr}: cannot resolve: {exc}") from None
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect((ip, 9))  # UDP connect sends nothing; it only asks the routing table
        except OSError as exc:
            raise UserError(f"--master-addr {addr}: no route: {exc}") from None
        local = s.getsockname()[0]
    for name, addrs in psutil.net_if_addrs().items():
        if any(a.family == socket.AF_INET and a.address == local for a in addrs):
            return name
    raise UserError(f"--master-addr {addr}: no interface holds the local address {local}; pass --ifname")


def ipv4_of(ifname: str) -> str | None:
    import psutil

    return next((a.address for a in psutil.net_if_addrs().get(ifname, []) if a.family == socket.AF_INET), None)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def decoder_layer_classes(model_config) -> str:
    import transformers

    names: list[str] = []
    for arch in getattr(model_config, "architectures", None) or []:
        cls = getattr(transformers, arch, None)
        names += [n for n in (getattr(cls, "_no_split_modules", None) or []) if n.endswith("Layer")]
    if not names:
        raise UserError(f"fsdp: cannot tell the decoder-layer class of {getattr(model_config, 'architectures', None)}"
                        "; no _no_split_modules on the model class")
    return ",".join(dict.fromkeys(names))


def build_parser() -> argparse.ArgumentParser:
    ap = command_parser("launch", "Run finetune across processes and nodes through accelerate.",
                        usage="launch --strategy ddp|fsdp [options] -- finetune --config X [...]")
    ap.add_argument("--strategy", choices=["ddp", "fsdp"], required=True)
    ap.add_argument("--launcher", choices=["torchrun", "ray"], default="torchrun",
                    help="torchrun from this node (default), or Ray Train on the Ray cluster at --address")
    renamed(ap, "--engine", "--launcher")  # --engine is the container engine (toolbox run/create/cluster)
    ap.add_argument("--address", metavar="HOST:PORT", help="--launcher ray: the Ray head (e.g. 10.0.0.1:6379)")
    ap.add_argument("--insecure", action="store_true",
                    help="--launcher ray: use a Ray cluster without token authentication (anyone reaching it runs code)")
    ap.add_argument("--nproc", type=int, default=None, help="processes on this node (default: GPUs, or 2 on CPU); "
                    "with --launcher ray: workers per node (default 1)")
    ap.add_argument("--nnodes", "--nodes", type=int, default=1)
    ap.add_argument("--node-rank", type=int, default=0)
    ap.add_argument("--master-addr", default=None)
    ap.add_argument("--master-port", type=int, default=None)
    ap.add_argument("--transport", choices=["ethernet", "rdma"], default="ethernet")
    ap.add_argument("--ifname", default=None, help="network interface (default: the one that routes to the master)")
    ap.add_argument("--sync", default="every-step", help="every-step (default) or local-sgd:K")
    ap.add_argument("--cpu", action="store_true", help="CPU only, gloo (hides GPUs from the ranks)")
    ap.add_argument("--max-restarts", type=int, default=0,
                    help="restarts after a failure (torchrun's; with --launcher ray, Ray Train's max_failures)")
    ap.add_argument("--dry-run", action="store_true", help="resolve, write and print the settings; do not run")
    ap.add_argument("--plan", action="store_true", help="print the memory plan per device for this world size "
                    "and strategy (finetune's --device-memory, else GPU 0's free memory), and exit")
    return ap


class _ShowPlan(Exception):
    """--plan: the table is printed; launch exits with this code and starts nothing."""

    def __init__(self, code: int):
        self.code = code


def resolve(argv: list[str]) -> dict[str, Any]:
    if "--" not in argv:
        build_parser().parse_args(argv)  # --help, or a usage error, before the missing `--`
        raise UserError("expected `-- finetune --config X ...` after the launch options")
    i = argv.index("--")
    args = build_parser().parse_args(argv[:i])
    cmd = argv[i + 1:]
    if not cmd or Path(cmd[0]).name != "finetune":
        raise UserError(f"after --: expected `finetune ...`, got {shlex.join(cmd) or 'nothing'}")
    ft = finetune.build_parser().parse_args(cmd[1:])
    if args.launcher == "ray":
        from toolbox_train.commands.ray_train import prepare_args

        prepare_args(args)  # --address stands for --master-addr/--master-port
        args.master_port = free_port()  # recorded only: Ray makes the process group on a port of its own
    elif args.address or args.insecure:
        raise UserError(f"{'--address' if args.address else '--insecure'}: only with --launcher ray")
    for name, v in (("--nnodes", args.nnodes), ("--max-restarts", args.max_restarts + 1)):
        if v < 1:
            raise UserError(f"{name}: must be >= {1 if name == '--nnodes' else 0}")
    if not 0 <= args.node_rank < args.nnodes:
        raise UserError(f"--node-rank {args.node_rank}: must be in 0..{args.nnodes - 1}")
    if args.nnodes > 1 and (not args.master_addr or not args.master_port):
        raise UserError("--nnodes > 1 needs --master-addr and --master-port")
    sync = parse_sync(args.sync)

    if args.cpu:
        os.environ["CUDA_VISIBLE_DEVICES"] = ""  # before torch is imported here
    import torch

    gpus = torch.cuda.device_count() if not args.cpu else 0
    cpu = args.cpu or (gpus == 0 and args.launcher == "torchrun")  # Ray: the workers' nodes have the GPUs
    nproc = args.nproc or (1 if args.launcher == "ray" else gpus or 2)
    if nproc < 1:
        raise UserError("--nproc: must be >= 1")
    world = nproc * args.nnodes
    if args.launcher == "ray" and not (args.dry_run or args.plan or ft.plan):
        from toolbox_train.commands.ray_train import join

        towards = args.ifname or interface_for(args.master_addr)
        join(args, nproc, cpu, towards, ipv4_of(towards))  # no head, no token, too few nodes/GPUs: before the data

    if args.plan or ft.plan:
        raise _ShowPlan(finetune.show_plan(ft.config, ft.set, ft.device_memory, world_size=world,
                                           fsdp=args.strategy == "fsdp"))
    # Everything the ranks would refuse, refused here first: before any process starts. The GPU
    # is left alone here (each rank plans against its own free memory) unless --device-memory.
    p = resolve_run(ft.config, ft.set, resume=ft.resume, overwrite=ft.overwrite, world_size=world,
                    fsdp=args.strategy == "fsdp", gpu=not cpu, sync_mode=sync, device_memory=ft.device_memory,
                    probe_device=False)
    preflight.validate(p)  # every dataset row, the chat template, the lengths: before any rank starts
    if args.strategy == "fsdp" and cpu and not args.dry_run:
        raise UserError("--strategy fsdp needs GPUs (accelerate refuses FSDP on CPU); use --strategy ddp --cpu")
    if sync != "every-step" and args.strategy == "fsdp":
        raise UserError("--sync local-sgd works with ddp only (accelerate's LocalSGD averages whole parameters)")

    template = {"ddp": "ddp-cpu.yaml" if cpu else "ddp.yaml", "fsdp": "fsdp.yaml"}[args.strategy]
    acc = yaml.safe_load(shipped_config(template).read_text())
    multinode = args.nnodes > 1
    acc.update(num_processes=world, num_machines=args.nnodes, machine_rank=args.node_rank,
               main_process_ip=args.master_addr or "127.0.0.1",
               main_process_port=args.master_port or free_port(),
               rdzv_backend="c10d" if multinode else "static", same_network=True)
    if args.strategy == "fsdp":
        acc["fsdp_config"]["fsdp_transformer_layer_cls_to_wrap"] = decoder_layer_classes(p.model_config)
        acc["fsdp_config"]["fsdp_activation_checkpointing"] = bool(p.gradient_checkpointing)
    if p.precision in ("bf16", "fp16"):
        acc["mixed_precision"] = p.precision

    env: dict[str, str] = {SYNC_ENV: sync}
    if cpu:
        env.update(CUDA_VISIBLE_DEVICES="", HIP_VISIBLE_DEVICES="")
    ifname = args.ifname or (interface_for(args.master_addr) if (multinode or args.master_addr) else None)
    if ifname:
        env.update(NCCL_SOCKET_IFNAME=ifname, GLOO_SOCKET_IFNAME=ifname)
    reasons: dict[str, str] = {}
    if (multinode or args.master_addr) and args.transport == "ethernet":
        env["NCCL_IB_DISABLE"] = "1"
    elif multinode or args.master_addr:
        # Per GPU (gfx1151 differs) and per NIC (the device and GID entry read from sysfs).
        for s in rdma.settings(rdma.detect_gpu_arch(), rdma.read_ports(), ifname, ipv4_of(ifname) if ifname else None):
            if s.value is not None:
                env[s.name] = s.value
            reasons[s.name] = s.reason if s.value is not None or s.name not in os.environ else "from the environment"
    for k in list(env):
        if k in os.environ and k not in (SYNC_ENV, "CUDA_VISIBLE_DEVICES"):
            if k in reasons and env[k] != os.environ[k]:
                reasons[k] = f"from the environment (launch would set {env[k]}: {reasons[k]})"
            env[k] = os.environ[k]  # the user's explicit setting wins

    launch_dir = p.out / LAUNCH_DIR
    # One file per node: nodes sharing an output folder (NFS) must not read each other's machine_rank.
    acc_path = launch_dir / f"accelerate.node{args.node_rank}.yaml"
    command = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(acc_path),
               "--max_restarts", str(args.max_restarts), "-m", "toolbox_train.commands.finetune", *cmd[1:]]
    return {"args": args, "run": p, "finetune_args": ft, "accelerate": acc, "acc_path": acc_path, "launch_dir": launch_dir,
            "env": env, "reasons": reasons, "command": command, "world": world, "nproc": nproc, "cpu": cpu}


def main(argv: list[str] | None = None) -> int:
    return run_command("launch", _launch, argv)


def _launch(argv: list[str]) -> int:
    try:
        r = resolve(argv)
    except _ShowPlan as shown:
        return shown.code
    a, p = r["args"], r["run"]
    settings = {
        "launcher": a.launcher, "strategy": a.strategy, "device": "cpu (gloo)" if r["cpu"] else "gpu (nccl/rccl)",
        "world_size": r["world"], "nproc_per_node": r["nproc"], "nnodes": a.nnodes, "node_rank": a.node_rank,
        "master": f"{r['accelerate']['main_process_ip']}:{r['accelerate']['main_process_port']}",
        "rendezvous": r["accelerate"]["rdzv_backend"], "transport": a.transport, "sync": r["env"][SYNC_ENV],
        "max_restarts": a.max_restarts, "backend": p.backend, "method": p.cfg.method,
        "gradient_accumulation_steps": p.grad_accum, "accelerate_config": str(r["acc_path"]),
        "env": r["env"], "command": shlex.join(r["command"]),
    }
    if r["reasons"]:
        shown = {**os.environ, **r["env"]}
        settings["rdma"] = {k: f"{shown.get(k, '(unset)')}  # {why}" for k, why in r["reasons"].items()}
    if a.launcher == "ray":  # Ray makes the process group; the network settings are each node's own
        settings.update(master=a.address, rendezvous="Ray Train (TorchConfig)", env={SYNC_ENV: r["env"][SYNC_ENV]},
                        command=f"Ray Train TorchTrainer, {r['world']} worker(s)")
        settings.pop("rdma", None)
    if a.strategy == "fsdp":
        settings["fsdp_wrap"] = r["accelerate"]["fsdp_config"]["fsdp_transformer_layer_cls_to_wrap"]
    if a.launcher == "ray" and not a.dry_run:
        from toolbox_train.commands import ray_train  # ray is imported on this path only (the `ray` extra)

        ray_train.check_run(r)  # shared storage, the inputs on every node: before anything is written
    atomic_write(r["acc_path"], yaml.safe_dump(r["accelerate"], sort_keys=False))
    atomic_write(r["launch_dir"] / f"settings.node{a.node_rank}.json", json.dumps(settings, indent=2) + "\n")
    print("launch: resolved settings", file=sys.stderr)
    for k, v in settings.items():
        if isinstance(v, dict) and k == "rdma":
            print(f"  {k}:", file=sys.stderr)
            for name, line in v.items():
                print(f"    {name}={line}", file=sys.stderr)
        else:
            print(f"  {k}: {v}", file=sys.stderr)
    sys.stderr.flush()
    if a.dry_run:
        return 0
    if a.launcher == "ray":
        return ray_train.train(r, argv)
    # finetune's first local rank writes this once every rank is past training, saving and
    # leaving the process group; a rank that dies after that (gloo threads torn down in
    # finalization: SIGABRT) lost nothing. One node only: with several, the other nodes' agents
    # wait in torchrun's exit barrier (5 min) for this one, and it is `toolbox cluster launch`
    # that sees the non-zero exit after "finished", reports the same and stops them.
    finished = r["launch_dir"] / f"{FINISHED}.node{a.node_rank}"
    finished.unlink(missing_ok=True)
    env = {**os.environ, **r["env"], FINISHED_ENV: str(finished)}
    try:
        code, terminated = _torchrun(r["command"], env)
    except Terminated:  # a KeyboardInterrupt too, but exit 143, not 130
        raise
    except KeyboardInterrupt:
        return 130
    if terminated:
        raise Terminated(f"passed on to the ranks (torchrun exit {code}); the checkpoints written so far are "
                         "kept: the same command with `finetune ... --resume` continues from the newest")
    if code != 0 and a.nnodes == 1 and finished.is_file():
        print(f"launch: warning: a rank ended with exit code {code} after training had finished on every rank "
              "and the summary was written (see above); nothing was lost", file=sys.stderr)
        return 0
    return code


def _torchrun(command: list[str], env: dict) -> tuple[int, bool]:
    """torchrun in the foreground. A SIGTERM to launch (`podman stop`, a scheduler) is passed on to
    torchrun, which passes it to every rank; launch waits for them instead of leaving them orphaned."""
    proc = subprocess.Popen(command, env=env)
    got: list[int] = []

    def forward(signum, frame):
        got.append(signum)
        proc.send_signal(signum)

    old = signal.signal(signal.SIGTERM, forward)
    try:
        return proc.wait(), bool(got)
    finally:
        signal.signal(signal.SIGTERM, old)


if __name__ == "__main__":
    raise SystemExit(main())
