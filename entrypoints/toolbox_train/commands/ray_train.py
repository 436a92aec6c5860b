"""`launch --launcher ray --address HEAD:6379 --nodes N -- finetune --config X`: the same fine-tune as a
Ray Train TorchTrainer on a running Ray cluster, one worker per GPU (or per CPU slot with --cpu).

Each worker runs finetune.run, as a torchrun rank does, with the environment `accelerate launch`
would give that rank (accelerate's own prepare_multi_gpu_env over the same accelerate config, so
DDP/FSDP settings reach transformers the same way); Ray has already made the process group.
The network settings (GLOO/NCCL_SOCKET_IFNAME, RDMA HCA, GID index) are per node: they come from
each node's `ray start` environment (`toolbox cluster ray up` sets them), which Ray's workers inherit.

Ray is imported here only, and only on this path (the `ray` extra). Read against ray 2.60.0.
"""

from __future__ import annotations

import json
import os
import secrets
import shlex
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

from toolbox_train.contract import Terminated, ToolError, UserError
from toolbox_train.disk import atomic_write
from toolbox_train.config.sync import ENV as SYNC_ENV

# finetune's own knobs (test hooks), passed on as torchrun's ranks inherit them; the network
# settings are not: they are each node's, from its `ray start` environment.
FORWARD = ("TOOLBOX_STOP_AFTER_STEP", "TOOLBOX_COUNT_GRAD_ALLREDUCE", "TOOLBOX_DEBUG")
ATTEMPTS = "ray-attempts"  # in the launch folder: how many times this launch's workers started
CHECK_TIMEOUT_S = 60
# What `ray._raylet.GcsClient` answers when the cluster wants a token and the caller has none.
_AUTH_PROBE = r"""
import sys
from ray._raylet import GcsClient
try:
    GcsClient(address=sys.argv[1]).internal_kv_get(b"toolbox-auth-probe", None, timeout=10)
except Exception as exc:
    print("AUTH" if "Authentication" in type(exc).__name__ or "InvalidAuthToken" in str(exc) else
          "ERROR " + type(exc).__name__ + ": " + str(exc).splitlines()[0][:200])
else:
    print("OPEN")
"""


def split_address(address: str) -> tuple[str, int]:
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise UserError(f"--address {address}: expected HOST:PORT of the Ray head (e.g. 10.0.0.1:6379)")
    return host.strip("[]"), int(port)


def prepare_args(args) -> None:
    """launch's own flags for the Ray launcher: --address replaces --master-addr/--master-port."""
    import importlib.util

    if importlib.util.find_spec("ray") is None:
        raise ToolError("--launcher ray needs Ray Train, which is not installed here: "
                        "pip install 'strix-toolbox[ray]' (ray[train]==2.60.0)")
    if not args.address:
        raise UserError("--launcher ray needs --address HEAD:PORT (the Ray head's GCS address, e.g. 10.0.0.1:6379)")
    for flag, value in (("--master-addr", args.master_addr), ("--master-port", args.master_port),
                        ("--node-rank", args.node_rank or None)):
        if value:
            raise UserError(f"{flag}: not used with --launcher ray (Ray places the workers; give --address)")
    args.master_addr = split_address(args.address)[0]  # launch's interface: the one routing to the head


def _reachable(host: str, port: int) -> None:
    try:
        with socket.create_connection((host, port), timeout=5):
            return
    except OSError as exc:
        raise UserError(f"--address {host}:{port}: no Ray head there ({exc.strerror or exc})") from None


def _token_available() -> bool:
    if os.environ.get("RAY_AUTH_TOKEN"):
        return True
    path = os.environ.get("RAY_AUTH_TOKEN_PATH") or str(Path.home() / ".ray" / "auth_token")
    return Path(path).is_file()


def check_auth(address: str, insecure: bool) -> None:
    """Refuse a cluster that runs code for anyone who can reach it, unless --insecure.

    Asked as a client with no token: a cluster with token authentication answers
    "InvalidAuthToken"; one without it answers the request."""
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH")}
    env.update(RAY_AUTH_MODE="disabled", HOME=os.environ.get("TMPDIR", "/tmp") + "/toolbox-no-ray-token")
    try:
        out = subprocess.run([sys.executable, "-c", _AUTH_PROBE, address], env=env, capture_output=True,
                             text=True, timeout=CHECK_TIMEOUT_S).stdout.strip().splitlines()
    except subprocess.TimeoutExpired:
        raise UserError(f"--address {address}: no answer from a Ray head within {CHECK_TIMEOUT_S} s") from None
    verdict = out[-1] if out else "ERROR no answer"
    if verdict == "OPEN":
        if not insecure:
            raise UserError(f"--address {address}: this Ray cluster has no token authentication, so anyone who can "
                            "reach its port can run any code on every node; start it with `toolbox cluster ray up` "
                            "(RAY_AUTH_MODE=token), or pass --insecure to use it anyway")
        os.environ["RAY_AUTH_MODE"] = "disabled"
        return
    if verdict != "AUTH":
        raise UserError(f"--address {address}: not a Ray head ({verdict.removeprefix('ERROR ')})")
    if not _token_available():
        raise UserError(f"--address {address}: the cluster wants its token: set RAY_AUTH_TOKEN_PATH to the file "
                        "`toolbox cluster ray up` wrote (or RAY_AUTH_TOKEN)")
    os.environ["RAY_AUTH_MODE"] = "token"


def accelerate_env(acc_path: Path) -> dict[str, str]:
    """What `accelerate launch --config_file acc_path` puts in each rank's environment (DDP/FSDP
    plugin settings, mixed precision, dynamo), minus torchrun's rendezvous, which Ray does."""
    from accelerate.commands.launch import _validate_launch_command, launch_command_parser
    from accelerate.utils.launch import prepare_multi_gpu_env

    args = launch_command_parser().parse_args(["--config_file", str(acc_path), "-m", "toolbox_train"])
    args, _, _ = _validate_launch_command(args)
    before = dict(os.environ)
    env = prepare_multi_gpu_env(args)
    skip = {"MASTER_ADDR", "MASTER_PORT", "PYTHONPATH"}
    return {k: v for k, v in env.items() if before.get(k) != v and k not in skip}


def _node_probe(marker: str, paths: list[str]) -> dict:
    """Run on each node: can it read the driver's marker (shared storage), see the inputs, and
    which network/GPU settings did its `ray start` give the workers."""
    try:
        shared = Path(marker).read_text().strip()
    except OSError:
        shared = None
    keys = ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME", "HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES")
    return {"shared": shared, "missing": [p for p in paths if not Path(p).exists()],
            "env": {k: os.environ[k] for k in keys if k in os.environ}}


def _fitting_nodes(ray, per_node: int, gpu: bool) -> list[dict]:
    kind = "GPU" if gpu else "CPU"
    return [n for n in ray.nodes() if n.get("Alive") and n.get("Resources", {}).get(kind, 0) >= per_node]


def check_capacity(ray, nodes_wanted: int, per_node: int, gpu: bool) -> None:
    """Enough live nodes with the GPUs (or CPUs) asked for."""
    kind = "GPU" if gpu else "CPU"
    alive = [n for n in ray.nodes() if n.get("Alive")]
    fit = [n for n in alive if n.get("Resources", {}).get(kind, 0) >= per_node]
    if len(fit) < nodes_wanted:
        have = ", ".join(f"{n['NodeManagerAddress']}: {n.get('Resources', {}).get(kind, 0):g}" for n in alive)
        hint = " (Ray saw no GPU: start the nodes with --num-gpus, as `toolbox cluster ray up` does)" if gpu else ""
        raise UserError(f"--nodes {nodes_wanted} x --nproc {per_node}: the cluster has {len(fit)} node(s) with "
                        f"{per_node} {kind}(s) to give ({have}){hint}")


def check_nodes(ray, r: dict, nodes_wanted: int, per_node: int, gpu: bool) -> None:
    """Shared output storage, the inputs on every node, each node's network settings."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    fit = _fitting_nodes(ray, per_node, gpu)
    p = r["run"]
    nonce = secrets.token_hex(8)
    # In the output folder, or where it will be made: nothing is left there after the check.
    where = next(d for d in (p.out, *p.out.parents) if d.is_dir())
    marker = where / f".toolbox-ray-shared-check.{nonce}"
    marker.write_text(nonce + "\n")
    inputs = [str(x) for x in _inputs(r)]
    probe = ray.remote(num_cpus=0)(_node_probe)
    try:
        refs = {n["NodeManagerAddress"]: probe.options(scheduling_strategy=NodeAffinitySchedulingStrategy(
            n["NodeID"], soft=False)).remote(str(marker), inputs) for n in fit}
        answers = dict(zip(refs, ray.get(list(refs.values()), timeout=CHECK_TIMEOUT_S)))
    finally:
        marker.unlink(missing_ok=True)
    for ip, a in answers.items():
        if a["shared"] != nonce and nodes_wanted > 1:
            raise UserError(f"output.dir {p.out}: not shared with node {ip} (it cannot read what this node wrote "
                            "there); with --nodes > 1 the output folder (checkpoints) must be on storage every "
                            "node mounts at the same path (NFS or the like)")
        if a["missing"]:
            raise UserError(f"node {ip} cannot see {a['missing'][0]}; the config, model and data must be at the "
                            "same path on every node")
        if "ROCR_VISIBLE_DEVICES" in a["env"] and "HIP_VISIBLE_DEVICES" not in a["env"]:
            raise UserError(f"node {ip}: ROCR_VISIBLE_DEVICES is set in its `ray start` environment; Ray 2.60 "
                            "refuses it (it assigns GPUs through HIP_VISIBLE_DEVICES): use HIP_VISIBLE_DEVICES")
        ifname = "NCCL_SOCKET_IFNAME" if gpu else "GLOO_SOCKET_IFNAME"
        if nodes_wanted > 1 and ifname not in a["env"]:
            raise UserError(f"node {ip}: no {ifname} in its `ray start` environment, so its workers would pick "
                            "an interface (often loopback) that other nodes cannot reach; start the nodes with "
                            "`toolbox cluster ray up`, or with that variable set")


def _inputs(r: dict) -> list[Path]:
    """The files every worker reads: the config, the local model folder and data files."""
    from toolbox_train.data.dataset import resolve_local

    p = r["run"]
    found = [Path(r["finetune_args"].config).resolve()]
    if Path(p.model_path).exists():
        found.append(Path(p.model_path).resolve())
    for path in p.cfg.data.paths():
        local = resolve_local(path, p.base)
        if local is not None:
            found.append(local)
    return found


def _worker(cfg: dict) -> None:
    """One Ray Train worker: finetune.run with a torchrun rank's environment."""
    os.environ.update(cfg["env"])
    try:
        os.chdir(cfg["cwd"])  # as torchrun's ranks start where launch was run (relative paths)
    except OSError:
        pass
    # torchrun's name for the node rank: each node stages its own checkpoint copy under it.
    os.environ["GROUP_RANK"] = os.environ.get("NODE_RANK", "0")
    import torch.distributed as td

    from toolbox_train.commands import finetune

    counter = Path(cfg["attempts"])
    before = int(counter.read_text() or 0) if counter.is_file() else 0
    td.barrier()  # every rank has read the count before rank 0 bumps it
    if td.get_rank() == 0:
        atomic_write(counter, f"{before + 1}\n")
    if before:
        # Ray restarted the workers (FailureConfig): finetune treats it as torchrun's restart
        # (launch --max-restarts): it continues from the newest complete checkpoint.
        os.environ["TORCHELASTIC_RESTART_COUNT"] = str(before)
    finetune.run(cfg["config"], cfg["set"], resume=cfg["resume"], overwrite=cfg["overwrite"],
                 device_memory=cfg["device_memory"])


def resume_command(argv: list[str]) -> str:
    i = argv.index("--")
    tail = [a for a in argv[i + 1:] if a not in ("--resume", "--overwrite")]
    return shlex.join(["launch", *argv[:i], "--", *tail, "--resume"])


def join(args, nproc: int, cpu: bool, ifname: str, node_ip: str | None) -> None:
    """Before the config and data are read: the head answers, has token authentication (or
    --insecure) and the nodes and GPUs asked for. Joins the cluster from this node, as `node_ip`
    (this node's address on `ifname`, the interface towards the head)."""
    host, port = split_address(args.address)
    _reachable(host, port)
    check_auth(f"{host}:{port}", args.insecure)
    if not node_ip:
        raise UserError(f"--address {args.address}: no IPv4 address on {ifname}, the interface towards it; pass --ifname")
    import ray

    try:
        # The node IP given, always: without it Ray asks the routing table about 8.8.8.8.
        ray.init(address=f"{host}:{port}", _node_ip_address=node_ip, logging_level="WARNING",
                 configure_logging=True)
    except Exception as exc:  # noqa: BLE001 - Ray's connection errors have no common base
        raise ToolError(f"--address {args.address}: cannot join the Ray cluster from {node_ip}: "
                        f"{str(exc).splitlines()[0] if str(exc) else type(exc).__name__}") from None
    args.node_ip = node_ip
    check_capacity(ray, args.nnodes, nproc, not cpu)


def check_run(r: dict[str, Any]) -> None:
    """Before launch writes anything: shared storage and inputs on every node (needs the plan)."""
    import ray

    check_nodes(ray, r, r["args"].nnodes, r["nproc"], not r["cpu"])


def train(r: dict[str, Any], argv: list[str]) -> int:
    """The run itself, on the cluster `connect` joined; its summary printed as finetune prints it."""
    from ray.train import FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    a, p, ft = r["args"], r["run"], r["finetune_args"]
    host, port = split_address(a.address)
    gpu = not r["cpu"]
    env = {**accelerate_env(r["acc_path"]), SYNC_ENV: r["env"][SYNC_ENV],
           **{k: os.environ[k] for k in FORWARD if k in os.environ}}
    if r["cpu"]:
        env.update(CUDA_VISIBLE_DEVICES="", HIP_VISIBLE_DEVICES="")
    workers = r["world"]
    trainer = TorchTrainer(
        _worker,
        train_loop_config={"config": str(Path(ft.config).resolve()), "set": list(ft.set), "resume": ft.resume,
                           "overwrite": ft.overwrite, "device_memory": ft.device_memory, "env": env,
                           "cwd": os.getcwd(),
                           "attempts": str(r["launch_dir"] / f"{ATTEMPTS}.{secrets.token_hex(4)}")},
        torch_config=TorchConfig(backend="nccl" if gpu else "gloo"),
        scaling_config=ScalingConfig(num_workers=workers, use_gpu=gpu,
                                     resources_per_worker={"GPU": 1} if gpu else {"CPU": 1},
                                     placement_strategy="STRICT_SPREAD" if r["nproc"] == 1 else "PACK"),
        run_config=RunConfig(name=f"toolbox-{p.out.name}", storage_path=str(r["launch_dir"] / "ray"),
                             failure_config=FailureConfig(max_failures=a.max_restarts)),
    )
    print(f"launch: Ray Train: {workers} worker(s) on {a.nnodes} node(s) of {host}:{port}, driver on {a.node_ip}",
          file=sys.stderr, flush=True)
    try:
        result = trainer.fit()
        error = result.error
    except Terminated:  # a KeyboardInterrupt too, but exit 143, not 130
        raise
    except KeyboardInterrupt:
        return 130
    except Exception as exc:  # noqa: BLE001 - TrainingFailedError, or the head gone (RPC errors)
        error = exc
    if error is not None:
        try:
            _reachable(host, port)
            what = f"the run failed: {_first(error)}"
        except UserError:
            what = f"the Ray head {host}:{port} went away during the run"
        raise ToolError(f"{what}; to resume from the last checkpoint: {resume_command(argv)}")
    return _print_summary(p.out, ft.json)


def _first(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return (text[-1] if text else type(exc).__name__)[:300]


def _print_summary(out: Path, as_json: bool) -> int:
    from toolbox_train.commands import finetune_report as report
    from toolbox_train.runs.folder import SUMMARY

    try:
        summary = json.loads((out / SUMMARY).read_text())
    except (OSError, ValueError) as exc:
        raise ToolError(f"the run ended but left no readable {out / SUMMARY}: {exc}") from None
    print(json.dumps(summary) if as_json else report.human(summary))
    return 0
