"""The command each host runs: `launch ... -- finetune ...`, bare or inside the image/container."""

from __future__ import annotations

import os
import re

from toolbox.cluster.probe import HostInfo
from toolbox.errors import UserError

# Forwarded when set locally; more with --env NAME. Values travel on the SSH channel's stdin.
DEFAULT_SECRETS = ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "WANDB_API_KEY")
_PLACEHOLDER = re.compile(r"\{(node_rank|host|nnodes)\}")


def launch_argv(strategy: str, nnodes: int, rank: int, master_addr: str, master_port: int, transport: str,
                nproc: int | None, sync: str | None, cpu: bool, command: list[str]) -> list[str]:
    argv = ["launch", "--strategy", strategy, "--nnodes", str(nnodes), "--node-rank", str(rank),
            "--master-addr", master_addr, "--master-port", str(master_port), "--transport", transport]
    if nproc:
        argv += ["--nproc", str(nproc)]
    if sync:
        argv += ["--sync", sync]
    if cpu:
        argv.append("--cpu")
    return argv + ["--", *command]


def substitute(command: list[str], rank: int, host: str, nnodes: int) -> list[str]:
    """`{node_rank}`, `{host}`, `{nnodes}` in the command, e.g. a per-host output_dir."""
    values = {"node_rank": str(rank), "host": host, "nnodes": str(nnodes)}
    return [_PLACEHOLDER.sub(lambda m: values[m.group(1)], word) for word in command]


def node_env(info: HostInfo, rank: int, run_id: str, transport: str, extra_names: list[str],
             path_prefix: str | None, workdir: str | None) -> dict[str, str]:
    env = {
        "TOOLBOX_CLUSTER_RUN": run_id,
        "TOOLBOX_CLUSTER_HOST": info.host.destination,
        "TOOLBOX_NODE_RANK": str(rank),
        # Every process the node starts carries it: how its wrapper finds them all to stop them.
        "TOOLBOX_NODE_ID": f"{run_id}-{rank}",
    }
    if info.host.ifname:
        # torch picks the interface of the machine's host name otherwise, often the wrong one.
        env["GLOO_SOCKET_IFNAME"] = info.host.ifname
        env["NCCL_SOCKET_IFNAME"] = info.host.ifname
    if transport == "ethernet":
        env["NCCL_IB_DISABLE"] = "1"
    if path_prefix:
        env["TOOLBOX_PATH_PREFIX"] = path_prefix
    if workdir:
        env["TOOLBOX_WORKDIR"] = workdir
    for name in DEFAULT_SECRETS:
        if name in os.environ:
            env[name] = os.environ[name]
    for name in extra_names:
        if name not in os.environ:
            raise UserError(f"--env {name}: not set in this environment")
        env[name] = os.environ[name]
    return env


def podman_options(info: HostInfo, transport: str, workdir: str | None) -> list[str]:
    """`podman run` options for a node's container: the host's network and IPC, its GPUs and
    RDMA devices, and the work folder at the same path."""
    run = ["--network", "host", "--ipc", "host"]
    if "/dev/kfd" in info.devices:
        run += ["--device", "/dev/kfd", "--device", "/dev/dri", "--group-add", "keep-groups",
                "--security-opt", "seccomp=unconfined"]
    if "/dev/nvidiactl" in info.devices:
        run += ["--device", "nvidia.com/gpu=all"]
    if transport == "rdma" and "/dev/infiniband" in info.devices:
        run += ["--device", "/dev/infiniband", "--ulimit", "memlock=-1:-1"]
    if workdir:
        run += ["-v", f"{workdir}:{workdir}", "-w", workdir]
    return run


def wrap_engine(engine: str, target: str, info: HostInfo, env: dict[str, str], argv: list[str],
               transport: str, workdir: str | None) -> list[str]:
    if engine == "none":
        return argv
    names = [n for n in env if n not in ("TOOLBOX_PATH_PREFIX", "TOOLBOX_WORKDIR", "PATH")]
    if engine == "podman":
        name = f"toolbox-{env['TOOLBOX_CLUSTER_RUN']}-{env['TOOLBOX_NODE_RANK']}"
        env["TOOLBOX_CONTAINER"] = name  # the node wrapper stops it by name
        run = ["podman", "run", "--rm", "--name", name, *podman_options(info, transport, workdir)]
        for n in names:
            run += ["-e", n]  # NAME alone: podman copies the value from its own environment
        return run + [target, *argv]
    if engine == "toolbx":
        # The variables are exported in the shell that runs this; what reaches the container
        # is up to toolbx/distrobox (distrobox copies the host environment).
        return ["toolbox", "run", "--container", target, *argv]
    if engine == "distrobox":
        return ["distrobox", "enter", target, "--", *argv]
    raise UserError(f"--engine {engine}: unknown (podman, toolbx, distrobox, none)")
