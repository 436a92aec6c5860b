"""`toolbox cluster launch` and `toolbox cluster check`."""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shlex
import sys
from pathlib import Path

from rich.console import Console
from rich.table import Table

from toolbox.argtypes import container_name, count, image_ref, renamed, sync_mode, tcp_port
from toolbox.cluster import ports
from toolbox.cluster.hosts import resolve_hosts
from toolbox.cluster.nodecmd import launch_argv, node_env, substitute, wrap_engine
from toolbox.cluster.probe import HostInfo, Prober, differences
from toolbox.cluster.runner import NodeJob, Runner, failure_reason
from toolbox.cluster.ssh import SshClient
from toolbox.errors import ToolError, UserError
from toolbox_train.config.rdma import choose

ALLREDUCE_SOURCE = (Path(__file__).parent / "allreduce.py").read_text()


def _console() -> Console:
    return Console(highlight=False, soft_wrap=True)


def _setup(args: argparse.Namespace):
    hosts = resolve_hosts(args.hosts, Path(args.hostfile) if args.hostfile else None)
    ssh = SshClient(Path(args.ssh_config) if args.ssh_config else None, list(args.ssh_option or []))
    if args.engine == "podman" and not args.image:
        raise UserError("--engine podman needs --image IMAGE (the same tag on every host)")
    if args.engine in ("toolbx", "distrobox") and not args.container:
        raise UserError(f"--engine {args.engine} needs --container NAME")
    target = args.image if args.engine == "podman" else (args.container or "")
    prober = Prober(ssh, args.engine, target, host_env(args))
    return hosts, ssh, prober, target


def host_env(args: argparse.Namespace) -> dict[str, str]:
    """What a host's own shell needs (probes, `cluster ray down/status`): the PATH prefix, and the
    --env variables set here (e.g. CONTAINERS_CONF: the host's podman must see it too)."""
    env = {"TOOLBOX_PATH_PREFIX": args.remote_path} if args.remote_path else {}
    env.update({name: os.environ[name] for name in args.env or [] if name in os.environ})
    return env


def _host_table(infos: list[HostInfo], master_addr: str) -> Table:
    table = Table(title=f"cluster (master {master_addr})")
    for col in ("host", "rank", "hostname", "interface", "address", "MTU", "devices"):
        table.add_column(col)
    for rank, info in enumerate(infos):
        dev = info.host.ifname or "-"
        table.add_row(info.host.destination, str(rank), info.hostname, dev, info.addr_on(dev) or "-",
                      str(info.mtu.get(dev, "-")), " ".join(info.devices + [f"rdma:{r}" for r in info.rdma]) or "-")
    return table


def _verify_same(console: Console, infos: list[HostInfo], engine: str, allow: bool) -> None:
    rows = differences(infos)
    if not rows:
        what = "package versions" if engine == "none" else "image id, digest and pins"
        console.print(f"cluster: all {len(infos)} hosts have the same {what}", markup=False)
        return
    table = Table(title="hosts differ")
    table.add_column("what")
    for info in infos:
        table.add_column(info.host.destination)
    for key, values in rows:
        table.add_row(key, *values)
    console.print(table)
    if not allow:
        raise ToolError(f"{len(rows)} difference(s) between hosts (table above); make them match,"
                        " or pass --allow-mismatch to start anyway")


def _mtu_note(console: Console, infos: list[HostInfo]) -> None:
    mtus = {info.mtu.get(info.host.ifname or "", 0) for info in infos}
    if len(mtus) > 1:
        console.print(f"cluster: warning: MTUs differ across hosts ({sorted(mtus)}); jumbo frames need the same MTU end to end",
                      markup=False)


def _check_port_free(ssh, infos, port: int) -> None:
    who = ports.holders(ssh, infos[0].host, port)
    if who is not None:
        raise ToolError(f"cannot start: master {ports.describe(infos[0].host, port, who)}")


def _run_nodes(args, console, ssh, infos, master_addr, target, node_argv, resume_hint: str | None,
               on_line=None) -> int:
    _check_port_free(ssh, infos, args.master_port)
    run_id = secrets.token_hex(4)
    jobs = []
    for rank, info in enumerate(infos):
        env = node_env(info, rank, run_id, args.transport, list(args.env or []), args.remote_path, args.workdir)
        argv = node_argv(rank, info)
        jobs.append(NodeJob(info.host, rank, wrap_engine(args.engine, target, info, env, argv, args.transport, args.workdir), env))
    console.print(f"cluster: run {run_id}: starting {len(jobs)} nodes: "
                  + ", ".join(f"{j.host.destination}=rank {j.rank}" for j in jobs), markup=False)
    outcome = Runner(ssh, console, on_line).run(jobs)
    for j in outcome.late:
        console.print(f"cluster: warning: {j.host.destination} (node rank {j.rank}) ended with {failure_reason(j)}"
                      " after its training had finished and its summary was written; nothing was lost",
                      markup=False)
    if outcome.returncode == 0:
        console.print(f"cluster: all {len(jobs)} nodes finished", markup=False)
        return 0
    # The nodes' wrappers only exit once all they started is gone; whatever still holds the
    # master port now would make the `--resume` below fail at once.
    try:
        who = ports.wait_free(ssh, infos[0].host, args.master_port, timeout=10)
    except ToolError as exc:
        console.print(f"cluster: warning: could not check the master port: {exc}", markup=False)
    else:
        if who is not None:
            console.print(f"cluster: warning: master {ports.describe(infos[0].host, args.master_port, who)}",
                          markup=False)
    if outcome.interrupted:
        console.print("cluster: interrupted; stopped " + (", ".join(j.host.destination for j in outcome.stopped) or "nothing"),
                      markup=False)
    for j in outcome.failed:
        console.print(f"cluster: FAILED: {j.host.destination} (node rank {j.rank}): {failure_reason(j)}", markup=False)
    if outcome.stopped and not outcome.interrupted:
        console.print("cluster: stopped " + ", ".join(j.host.destination for j in outcome.stopped), markup=False)
    if resume_hint and not outcome.usage_error:  # bad input: the same command fails the same way
        console.print(f"cluster: to resume from the last checkpoint: {resume_hint}", markup=False)
    return outcome.returncode


def cmd_launch(args: argparse.Namespace) -> int:
    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        raise UserError("no command: give it after `--`, e.g. -- finetune --config train.yaml")
    if args.resume and "--resume" not in command:
        command.append("--resume")
    console = _console()
    hosts, ssh, prober, target = _setup(args)
    infos, master_addr = prober.probe_all(hosts)
    console.print(_host_table(infos, master_addr))
    _verify_same(console, infos, args.engine, args.allow_mismatch)
    _mtu_note(console, infos)
    hint_argv = [a for a in sys.argv[1:] if a != "--resume"]
    if "--" in hint_argv:
        hint_argv.insert(hint_argv.index("--"), "--resume")
    else:
        hint_argv.append("--resume")
    hint = "toolbox " + shlex.join(hint_argv) if command[0] == "finetune" else None

    def node_argv(rank: int, info: HostInfo) -> list[str]:
        cmd = substitute(command, rank, info.host.destination, len(infos))
        return launch_argv(args.strategy, len(infos), rank, master_addr, args.master_port, args.transport,
                           args.nproc, args.sync, args.cpu, cmd)

    return _run_nodes(args, console, ssh, infos, master_addr, target, node_argv, hint)


def rdma_report(infos: list[HostInfo]) -> list[str]:
    """Per host: the RDMA port, GID table entry and NCCL_IB_HCA that `launch --transport rdma`
    will use there (toolbox_train.config.rdma.choose on the same sysfs data, read over SSH)."""
    lines = []
    for info in infos:
        ifname = info.host.ifname
        choice, why = choose(info.rdma_ports, ifname, info.addr_on(ifname) if ifname else None)
        head = f"cluster check: rdma on {info.host.destination}:"
        if choice is None:
            lines.append(f"{head} {why}; launch sets no NCCL_IB_HCA and falls back to GID 1 (gfx1151) or 3")
            continue
        p, g = choice.port, choice.gid
        entry = (f"GID {g.index} = {g.gid} ({g.type}, {g.ndev})" if g else "no RoCE v2 IPv4 GID entry")
        lines.append(f"{head} device {p.device} port {p.port} ({p.state}, {p.link_layer}), {entry}; "
                     f"NCCL_IB_HCA={'=' + p.hca}" + (f" NCCL_IB_GID_INDEX={g.index}" if g else "") + f" ({choice.why})")
    return lines


def cmd_check(args: argparse.Namespace) -> int:
    console = _console()
    hosts, ssh, prober, target = _setup(args)
    console.print(f"cluster: SSH: reaching {len(hosts)} hosts", markup=False)
    infos, master_addr = prober.probe_all(hosts)
    console.print(f"cluster: SSH ok on {', '.join(h.destination for h in hosts)}", markup=False)
    console.print(_host_table(infos, master_addr))
    _verify_same(console, infos, args.engine, args.allow_mismatch)
    _mtu_note(console, infos)
    if args.transport == "rdma":
        for line in rdma_report(infos):
            console.print(line, markup=False)

    # `launch` runs only finetune, so the check starts its one rank per node itself, on the same
    # SSH path, with the same per-host interface environment and master address.
    def node_argv(rank: int, info: HostInfo) -> list[str]:
        argv = ["python3", "-c", ALLREDUCE_SOURCE, "--nnodes", str(len(infos)), "--node-rank", str(rank),
                "--master-addr", master_addr, "--master-port", str(args.master_port),
                "--size-mib", str(args.size_mib), "--iters", str(args.iters)]
        return argv + (["--cpu"] if args.cpu else [])

    results: list[dict] = []

    def on_line(job, line: str) -> None:
        if job.rank == 0 and line.startswith("ALLREDUCE "):
            try:
                results.append(json.loads(line[len("ALLREDUCE "):]))
            except ValueError:
                pass

    rc = _run_nodes(args, console, ssh, infos, master_addr, target, node_argv, None, on_line)
    if not results:
        raise ToolError("all-reduce check: rank 0 reported no result (see the logs above)")
    r = results[-1]
    mtus = ", ".join(f"{i.host.destination} {i.host.ifname} MTU {i.mtu.get(i.host.ifname or '', '?')}" for i in infos)
    verdict = "correct" if r["ok"] and r["ranks_ok"] == r["world_size"] else "WRONG"
    console.print(f"cluster check: all-reduce sum {r['sum']:g} (expected {r['expected']:g}) {verdict} on "
                  f"{r['ranks_ok']}/{r['world_size']} ranks; dist-backend {r['dist_backend']}, transport {args.transport}",
                  markup=False)
    console.print(f"cluster check: latency {r['latency_us']} us (8 B); bandwidth {r['algbw_gbps']} GB/s algbw, "
                  f"{r['busbw_gbps']} GB/s busbw ({r['bytes'] / 2**20:g} MiB, {r['time_ms']} ms)", markup=False)
    console.print(f"cluster check: interfaces: {mtus}", markup=False)
    if verdict != "correct":
        return rc or 1
    return rc


def add_common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--hosts", help="comma-separated [user@]host[:port]; the first is the master")
    p.add_argument("--hostfile", help="one host per line (addr=IP ifname=IF optional); read before --hosts")
    p.add_argument("--transport", choices=("ethernet", "rdma"), default="ethernet")
    p.add_argument("--strategy", choices=("ddp", "fsdp"), default="ddp")
    p.add_argument("--engine", choices=("podman", "toolbx", "distrobox", "none"), default="podman",
                   help="run in the image with podman, in an existing toolbx/distrobox container, or bare")
    renamed(p, "--via", "--engine")
    p.add_argument("--image", type=image_ref, help="image tag for --engine podman (must be the same image on every host)")
    p.add_argument("--container", type=container_name, help="container name for --engine toolbx/distrobox")
    p.add_argument("--ssh-config", "-F", help="ssh_config file to use instead of ~/.ssh/config")
    p.add_argument("--ssh-option", "-o", action="append", metavar="KEY=VALUE", help="extra ssh -o option (repeatable)")
    p.add_argument("--env", action="append", metavar="NAME",
                   help="forward this variable's value (over SSH stdin, never argv); HF_TOKEN etc. go by default")
    p.add_argument("--master-port", type=tcp_port, default=29500)
    p.add_argument("--nproc", type=count, help="processes per node (default: launch decides, one per GPU)")
    p.add_argument("--sync", type=sync_mode, help="gradient sync: every-step or local-sgd:K (passed to launch)")
    p.add_argument("--cpu", action="store_true", help="train on CPU with gloo (tests, no GPU)")
    p.add_argument("--remote-path", help="directory put first on PATH on every host (e.g. a venv's bin) for --engine none")
    p.add_argument("--workdir", help="directory to run in on every host (mounted at the same path with podman)")
    p.add_argument("--allow-mismatch", action="store_true", help="start even if hosts differ in image or packages")
