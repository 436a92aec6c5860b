"""`toolbox cluster ray up|status|down`: a Ray cluster on the `toolbox cluster` hosts, for
`launch --engine ray`.

Over the same SSH host list, each host runs `ray start --block` in the toolbox container (or bare
with --via none) as the SSH user, in a session of its own, with the network settings `launch`
derives for that host (GLOO/NCCL_SOCKET_IFNAME, NCCL_IB_DISABLE, or the RDMA HCA/GID/GDR level)
in its environment, which Ray's workers inherit. Read against ray 2.60.0:
- token authentication on (RAY_AUTH_MODE=token); the token travels on the SSH channel's stdin
  like the other secrets and lands in a 0600 file in the node's Ray folder (RAY_AUTH_TOKEN_PATH);
- --node-ip-address always (without it `ray start --head` asks the routing table about
  8.8.8.8:53), and the workers join the head's cluster address;
- --num-gpus always: Ray counts AMD GPUs through the `amdsmi` Python package (2.60's pyamdsmi
  shim; older Rays loaded librocm_smi64.so from $ROCM_PATH) and reports 0 when that fails; the
  count given is torch's, as `doctor` reports it;
- the dashboard off: ray[train] lacks its packages, and nothing here needs it.
Ray 2.60's GCS and raylet still listen on every interface (measured: `ss -ltn` shows *:6379),
whatever the node IP; the token is what guards them, so keep the cluster network private.
"""

from __future__ import annotations

import argparse
import os
import secrets
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from rich.console import Console

from toolbox.cluster.nodecmd import node_env, substitute, wrap_via
from toolbox.cluster.probe import HostInfo
from toolbox.errors import ToolError, UserError
from toolbox.paths import state_dir
from toolbox_train.distributed import rdma

# Alive = a `ray start` that is not a zombie: a node whose processes were just killed can leave
# one for a moment (kill -0 succeeds on it), and `up` then took the dead node for a running one.
ALIVE = r"""
alive() { [ -r "/proc/$1/status" ] && ! grep -q '^State:[[:space:]]*Z' "/proc/$1/status" 2>/dev/null \
  && tr '\0' ' ' < "/proc/$1/cmdline" 2>/dev/null | grep -q "ray start"; }
"""

# $1 role, $2 node IP, $3 head address, $4 port, $5 Ray folder, $6 GPUs ("" = count them).
START = ALIVE + r"""
role=$1 ip=$2 head=$3 port=$4 dir=$5 gpus=$6
umask 077
mkdir -p "$dir" || exit 1
pidf=$dir/toolbox-ray.pid log=$dir/toolbox-ray.log
if [ -f "$pidf" ] && alive "$(cat "$pidf")"; then echo "ray: already running (pid $(cat "$pidf"))"; exit 0; fi
if [ -z "${RAY_AUTH_TOKEN:-}" ]; then
  echo "ray: the cluster token did not reach this shell (toolbx passes only its own set of variables into the container): use --via distrobox or none"; exit 1
fi
printf '%s' "$RAY_AUTH_TOKEN" > "$dir/auth_token" || exit 1
unset RAY_AUTH_TOKEN
export RAY_AUTH_MODE=token RAY_AUTH_TOKEN_PATH="$dir/auth_token" RAY_USAGE_STATS_ENABLED=0
if [ -z "$gpus" ]; then
  gpus=$(python3 -c 'import torch; print(torch.cuda.device_count())' 2>/dev/null) || { echo "ray: cannot count GPUs (python3 -c 'import torch' failed)"; exit 1; }
fi
if [ "$role" = head ]; then set -- --head --port "$port" --include-dashboard false; else set -- --address "$head"; fi
setsid ray start "$@" --node-ip-address "$ip" --num-gpus "$gpus" --disable-usage-stats --temp-dir "$dir" --block </dev/null >"$log" 2>&1 &
pid=$!
echo "$pid" > "$pidf"
i=0
while [ "$i" -lt 900 ]; do
  if grep -q "Ray runtime started" "$log"; then echo "ray: started (pid $pid, $gpus GPU(s), $ip)"; exit 0; fi
  alive "$pid" || break
  sleep 0.2; i=$((i + 1))
done
echo "ray: did not start; the end of $log:"; tail -n 8 "$log"; rm -f "$pidf"; exit 1
"""

# $1 Ray folder. `ray start --block` drains and stops all it started on TERM.
STOP = r"""
dir=$1 pidf=$1/toolbox-ray.pid
[ -f "$pidf" ] || { echo "ray: not running"; exit 0; }
pid=$(cat "$pidf")
if kill -0 "$pid" 2>/dev/null && tr '\0' ' ' < "/proc/$pid/cmdline" | grep -q "ray start"; then
  kill -TERM "$pid"
  i=0; while kill -0 "$pid" 2>/dev/null && [ "$i" -lt 250 ]; do sleep 0.2; i=$((i + 1)); done
  kill -0 "$pid" 2>/dev/null && kill -KILL -- "-$pid" 2>/dev/null
  echo "ray: stopped (pid $pid)"
else
  echo "ray: not running (stale pid file)"
fi
rm -f "$pidf" "$dir/auth_token"
"""

# $1 Ray folder, $2 head address (on the head only).
STATUS = ALIVE + r"""
dir=$1 pidf=$1/toolbox-ray.pid
if [ -f "$pidf" ] && alive "$(cat "$pidf")"; then echo "ray: running (pid $(cat "$pidf"))"; else echo "ray: not running"; exit 3; fi
[ -n "$2" ] || exit 0
RAY_AUTH_MODE=token RAY_AUTH_TOKEN_PATH="$dir/auth_token" ray status --address "$2"
"""


def token_file() -> Path:
    return state_dir() / "ray" / "auth_token"


def cluster_token() -> str:
    """The cluster's token: made once (256 bits, as `ray get-auth-token --generate` makes it), kept 0600."""
    path = token_file()
    if path.is_file():
        token = path.read_text().strip()
        if token:
            return token
    token = secrets.token_hex(32)
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(token)
    return token


def _network_env(info: HostInfo, transport: str) -> dict[str, str]:
    """What `launch` would set on this host (per host: the interface and NIC differ)."""
    env: dict[str, str] = {}
    if transport == "rdma":
        addr = info.addr_on(info.host.ifname) if info.host.ifname else None
        # The GPU arch from the image's stack label (gfx1151: no GPUDirect RDMA, NCCL_NET_GDR_LEVEL=0).
        arch = "gfx1151" if info.software.get("label stack", "").startswith("gfx1151") else None
        for s in rdma.settings(arch, info.rdma_ports, info.host.ifname, addr):
            if s.value is not None:
                env[s.name] = s.value
    return env


def _node(args, info: HostInfo, rank: int, head: str, token: str) -> tuple[list[str], dict[str, str]]:
    env = node_env(info, rank, "ray", args.transport, list(args.env or []), args.remote_path, args.workdir)
    env.pop("TOOLBOX_NODE_ID", None)  # the Ray processes outlive this SSH call on purpose
    env.update(_network_env(info, args.transport))
    env["RAY_AUTH_TOKEN"] = token
    ip = info.addr_on(info.host.ifname) if info.host.ifname else None
    if not ip:
        raise ToolError(f"{info.host.destination}: no IPv4 address on {info.host.ifname}")
    gpus = "0" if args.cpu else ("" if args.num_gpus is None else str(args.num_gpus))
    argv = ["sh", "-c", START, "toolbox-ray", "head" if rank == 0 else "worker", ip, head, str(args.port),
            ray_dir(args, rank, info), gpus]
    return argv, env


def ray_dir(args, rank: int, info: HostInfo) -> str:
    return substitute([args.ray_dir], rank, info.host.destination, 0)[0]


def _console() -> Console:
    return Console(highlight=False, soft_wrap=True)


def _run(ssh, args, target: str, info: HostInfo, argv: list[str], env: dict[str, str], timeout: float = 240):
    cmd = wrap_via(args.via, target, info, dict(env), argv, args.transport, args.workdir)
    proc = ssh.run(info.host, cmd, env=env, timeout=timeout)
    return proc.returncode, (proc.stdout + proc.stderr).decode(errors="replace").strip()


def _prepare(args):
    from toolbox.cluster.app import _setup, _verify_same

    if args.via == "podman":
        # `podman run --rm` ends with its SSH call; a detached container per node is not done yet.
        raise UserError("--via podman: not supported by `cluster ray` yet; start the toolbox container on each "
                        "host (toolbx or distrobox) and pass --via toolbx|distrobox --container NAME")
    console = _console()
    hosts, ssh, prober, target = _setup(args)
    infos, master_addr = prober.probe_all(hosts)
    _verify_same(console, infos, args.via, args.allow_mismatch)
    return console, ssh, infos, master_addr, target


def cmd_up(args: argparse.Namespace) -> int:
    console, ssh, infos, master_addr, target = _prepare(args)
    head = f"{master_addr}:{args.port}"
    token = cluster_token()
    nodes = [_node(args, info, rank, head, token) for rank, info in enumerate(infos)]

    def start(rank: int) -> tuple[int, str]:
        argv, env = nodes[rank]
        return _run(ssh, args, target, infos[rank], argv, env)

    results = {0: start(0)}  # the head first: the others join it
    if results[0][0] == 0:
        with ThreadPoolExecutor(max_workers=min(16, len(infos))) as pool:
            results.update(zip(range(1, len(infos)), pool.map(start, range(1, len(infos)))))
    failed = []
    for rank, info in enumerate(infos):
        if rank not in results:
            continue
        code, out = results[rank]
        for line in out.splitlines():
            console.print(f"[{info.host.destination}] {line}", markup=False)
        if code != 0:
            failed.append(info.host.destination)
    if failed:
        raise ToolError(f"ray did not start on {', '.join(failed)} (its log above); "
                        "`toolbox cluster ray down` stops the nodes that did")
    head_dir = ray_dir(args, 0, infos[0])
    console.print(f"cluster ray: {len(infos)} node(s) up, head {head}, token authentication on "
                  f"(token: {token_file()}; on the head: {head_dir}/auth_token)", markup=False)
    console.print(f"cluster ray: on the head: RAY_AUTH_TOKEN_PATH={head_dir}/auth_token launch --engine ray "
                  f"--address {head} --nodes {len(infos)} -- finetune --config train.yaml", markup=False)
    return 0


def cmd_down(args: argparse.Namespace) -> int:
    console, ssh, infos, _, target = _prepare(args)

    def stop(rank: int) -> tuple[int, str]:
        info = infos[rank]
        env = {"TOOLBOX_PATH_PREFIX": args.remote_path} if args.remote_path else {}
        return _run(ssh, args, target, info, ["sh", "-c", STOP, "toolbox-ray", ray_dir(args, rank, info)], env, 90)

    failed = []
    # Workers first, the head last: nodes drain towards a head that is still there.
    with ThreadPoolExecutor(max_workers=min(16, len(infos))) as pool:
        results = dict(zip(range(1, len(infos)), pool.map(stop, range(1, len(infos)))))
    results[0] = stop(0)
    for rank, info in enumerate(infos):
        code, out = results[rank]
        console.print(f"[{info.host.destination}] {out or 'ray: stopped'}", markup=False)
        if code != 0:
            failed.append(info.host.destination)
    if failed:
        raise ToolError(f"could not stop ray on {', '.join(failed)}")
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    console, ssh, infos, master_addr, target = _prepare(args)
    down = []
    for rank, info in enumerate(infos):
        env = {"TOOLBOX_PATH_PREFIX": args.remote_path} if args.remote_path else {}
        argv = ["sh", "-c", STATUS, "toolbox-ray", ray_dir(args, rank, info),
                f"{master_addr}:{args.port}" if rank == 0 else ""]
        code, out = _run(ssh, args, target, info, argv, env, 120)
        for line in out.splitlines():
            console.print(f"[{info.host.destination}] {line}", markup=False)
        if code != 0:
            down.append(info.host.destination)
    if down:
        raise ToolError(f"ray is not running on {', '.join(down)}; `toolbox cluster ray up` starts it")
    return 0


def register(sub) -> None:
    """`toolbox cluster ray up|status|down`."""
    from toolbox.argtypes import count, tcp_port
    from toolbox.cluster.app import add_common

    ray = sub.add_parser("ray", help="a Ray cluster on the hosts, for `launch --engine ray` (up, status, down)")
    actions = ray.add_subparsers(dest="ray_command", metavar="ACTION", required=True)
    for name, func, help_ in (("up", cmd_up, "start Ray on every host (head first), token authentication on"),
                              ("status", cmd_status, "whether Ray runs on each host; `ray status` from the head"),
                              ("down", cmd_down, "stop Ray on every host")):
        p = actions.add_parser(name, help=help_)
        add_common(p)
        p.add_argument("--port", type=tcp_port, default=6379, help="the head's GCS port")
        p.add_argument("--ray-dir", default="/tmp/toolbox-ray",
                       help="Ray's folder on each host (logs, sockets, token); {node_rank} and {host} are replaced")
        if name == "up":
            p.add_argument("--num-gpus", type=count, help="GPUs per host (default: as many as torch sees there)")
        p.set_defaults(func=func)
