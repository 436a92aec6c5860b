"""`toolbox cluster ray up|status|down`: a Ray cluster on the `toolbox cluster` hosts, for
`launch --launcher ray`.

Over the same SSH host list, each host runs `ray start --block` as the SSH user: the main process
of a detached container (--engine podman), or in a session of its own in the toolbx/distrobox
container or bare (--engine none), with the network settings `launch` derives for that host
(GLOO/NCCL_SOCKET_IFNAME, NCCL_IB_DISABLE, or the RDMA HCA/GID/GDR level) in its environment,
which Ray's workers inherit. Read against ray 2.60.0:
- token authentication on (RAY_AUTH_MODE=token); the token travels on the SSH channel's stdin
  like the other secrets and the host writes it to a 0600 file in the node's Ray folder
  (RAY_AUTH_TOKEN_PATH), with the node's environment beside it, before any container is entered;
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
import re
import secrets
import shlex
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from rich.console import Console

from toolbox.cluster.app import host_env
from toolbox.cluster.nodecmd import node_env, podman_options, substitute, wrap_engine
from toolbox.cluster.probe import HostInfo
from toolbox.errors import ToolError
from toolbox.files import atomic_write
from toolbox.paths import state_dir
from toolbox_train.config import rdma

# Alive = a `ray start` that is not a zombie: a node whose processes were just killed can leave
# one for a moment (kill -0 succeeds on it), and `up` then took the dead node for a running one.
ALIVE = r"""
alive() { [ -r "/proc/$1/status" ] && ! grep -q '^State:[[:space:]]*Z' "/proc/$1/status" 2>/dev/null \
  && tr '\0' ' ' < "/proc/$1/cmdline" 2>/dev/null | grep -q "ray start"; }
"""

CONTAINER_RUNNING = r"""
container_running() { [ "$(podman container inspect -f '{{.State.Running}}' "$1" 2>/dev/null)" = true ]; }
"""

# On the host, before any container is entered: the token (0600) and the node's environment
# (its network settings, the --env variables: a 0600 file, sourced by the node) into its Ray
# folder, which the container shares (podman: mounted; toolbx/distrobox: a path they share with
# the host). So neither depends on what a container lets through: toolbx passes only its own set
# of variables. $1 Ray folder; the rest is the command to run next.
PREP = r"""
dir=$1; shift
umask 077
mkdir -p "$dir" || exit 1
printf '%s' "$RAY_AUTH_TOKEN" > "$dir/auth_token.new" && mv -f "$dir/auth_token.new" "$dir/auth_token" || exit 1
printf '%s\n' "$TOOLBOX_RAY_NODE_ENV" > "$dir/node.env.new" && mv -f "$dir/node.env.new" "$dir/node.env" || exit 1
unset RAY_AUTH_TOKEN TOOLBOX_RAY_NODE_ENV
exec "$@"
"""

# Where the node runs Ray (bare, or in its container): $1 role, $2 node IP, $3 head address,
# $4 port, $5 Ray folder, $6 GPUs ("" = count them). Leaves `ray start` ARGS in "$@".
RAY_ARGS = r"""
role=$1 ip=$2 head=$3 port=$4 dir=$5 gpus=$6
log=$dir/toolbox-ray.log
. "$dir/node.env" || exit 1
export RAY_AUTH_MODE=token RAY_AUTH_TOKEN_PATH="$dir/auth_token" RAY_USAGE_STATS_ENABLED=0
if [ -z "$gpus" ]; then
  gpus=$(python3 -c 'import torch; print(torch.cuda.device_count())' 2>/dev/null) || { echo "ray: cannot count GPUs (python3 -c 'import torch' failed)"; exit 1; }
fi
if [ "$role" = head ]; then set -- --head --port "$port" --include-dashboard false; else set -- --address "$head"; fi
set -- "$@" --node-ip-address "$ip" --num-gpus "$gpus" --disable-usage-stats --temp-dir "$dir" --block
"""

# Waits for $log to say Ray started while `running` holds ($what: what runs it).
WAIT = r"""
i=0
while [ "$i" -lt 900 ]; do
  if grep -q "Ray runtime started" "$log"; then echo "ray: started ($what, ${gpus:-all} GPU(s), $ip)"; exit 0; fi
  running || break
  sleep 0.2; i=$((i + 1))
done
echo "ray: did not start; the end of $log:"; tail -n 8 "$log"
"""

# Bare or in a toolbx/distrobox container (they share the host's process table): `ray start
# --block` in a session of its own, its pid in the Ray folder.
START = ALIVE + RAY_ARGS + r"""
pidf=$dir/toolbox-ray.pid
if [ -f "$pidf" ] && alive "$(cat "$pidf")"; then echo "ray: already running (pid $(cat "$pidf"))"; exit 0; fi
setsid ray start "$@" </dev/null >"$log" 2>&1 &
pid=$! what="pid $!"
echo "$pid" > "$pidf"
running() { alive "$pid"; }
""" + WAIT + r"""rm -f "$pidf"; exit 1
"""

# --engine podman: a detached container per node whose main process is `ray start --block` (podman
# stop = TERM to it: Ray drains and stops what it started). On the host: $1-$6 as RAY_ARGS,
# $7 container name, $8 image, $9 the script run in it (FOREGROUND), then `podman run` options.
PODMAN_START = CONTAINER_RUNNING + r"""
name=$7 image=$8 script=$9 dir=$5 gpus=$6 ip=$2 log=$5/toolbox-ray.log what="container $7"
running() { container_running "$name"; }
if running; then echo "ray: already running (container $name)"; exit 0; fi
podman rm -f "$name" >/dev/null 2>&1
: > "$log"
a1=$1 a2=$2 a3=$3 a4=$4 a5=$5 a6=$6; shift 9
podman run -d --name "$name" -v "$dir:$dir" "$@" "$image" sh -c "$script" toolbox-ray \
  "$a1" "$a2" "$a3" "$a4" "$a5" "$a6" >/dev/null || { echo "ray: podman run failed"; exit 1; }
""" + WAIT + r"""podman logs "$name" 2>&1 | tail -n 4; podman rm -f "$name" >/dev/null 2>&1; exit 1
"""
FOREGROUND = RAY_ARGS + r"""
exec ray start "$@" </dev/null >"$log" 2>&1
"""

# $1 Ray folder. `ray start --block` drains and stops all it started on TERM.
STOP = r"""
dir=$1 pidf=$1/toolbox-ray.pid
rm -f "$dir/auth_token" "$dir/node.env"
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
rm -f "$pidf"
"""

# $1 Ray folder, $2 container name.
PODMAN_STOP = r"""
rm -f "$1/auth_token" "$1/node.env"
if podman container exists "$2"; then
  podman stop -t 50 "$2" >/dev/null 2>&1; podman rm -f "$2" >/dev/null 2>&1; echo "ray: stopped (container $2)"
else
  echo "ray: not running"
fi
"""

# On the host: whether the node's Ray runs; then (on the head) the command after the first
# argument(s), `ray status` where Ray is. $1 Ray folder (STATUS) or container name (PODMAN_STATUS).
STATUS = ALIVE + r"""
pidf=$1/toolbox-ray.pid; shift
if [ -f "$pidf" ] && alive "$(cat "$pidf")"; then echo "ray: running (pid $(cat "$pidf"))"; else echo "ray: not running"; exit 3; fi
[ "$#" -eq 0 ] || exec "$@"
"""
PODMAN_STATUS = CONTAINER_RUNNING + r"""
name=$1; shift
if container_running "$name"; then
  echo "ray: running (container $name)"; else echo "ray: not running"; exit 3; fi
[ "$#" -eq 0 ] || exec "$@"
"""
# $1 Ray folder, $2 head address. Just after `up`, Ray's own status can still be "No cluster status. It may take a
# few seconds for the Ray internal services to start up." (seen on a fast CI machine): asked again for up to 30 s.
RAY_STATUS = r"""export RAY_AUTH_MODE=token RAY_AUTH_TOKEN_PATH="$1/auth_token"
for _ in $(seq 30); do
  out=$(ray status --address "$2" 2>&1); code=$?
  case $out in *"No cluster status"*) sleep 1 ;; *) break ;; esac
done
printf '%s\n' "$out"; exit $code
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
    atomic_write(path, token, mode=0o600)  # the temp file is 0600 from the start
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


def container_name(args, info: HostInfo) -> str:
    """--engine podman: the node's container, by port and host (test hosts can share one podman)."""
    return f"toolbox-ray-{args.port}-" + re.sub(r"[^A-Za-z0-9_.-]", "_", info.host.destination)


def _node(args, info: HostInfo, rank: int, head: str, token: str, target: str) -> tuple[list[str], dict[str, str]]:
    """The host's command for `up` and its environment (sent on the SSH channel's stdin)."""
    env = node_env(info, rank, "ray", args.transport, list(args.env or []), args.remote_path, args.workdir)
    env.pop("TOOLBOX_NODE_ID", None)  # the Ray processes outlive this SSH call on purpose
    env.update(_network_env(info, args.transport))
    ip = info.addr_on(info.host.ifname) if info.host.ifname else None
    if not ip:
        raise ToolError(f"{info.host.destination}: no IPv4 address on {info.host.ifname}")
    gpus = "0" if args.cpu else ("" if args.num_gpus is None else str(args.num_gpus))
    folder = ray_dir(args, rank, info)
    ray_args = ["head" if rank == 0 else "worker", ip, head, str(args.port), folder, gpus]
    if args.engine == "podman":
        node = ["sh", "-c", PODMAN_START, "toolbox-ray", *ray_args, container_name(args, info), target, FOREGROUND,
                *podman_options(info, args.transport, args.workdir)]
    else:
        node = wrap_engine(args.engine, target, info, dict(env), ["sh", "-c", START, "toolbox-ray", *ray_args],
                        args.transport, args.workdir)
    # What the node's Ray (and so every worker) runs with, as one line of `export`s for node.env.
    node_file = "; ".join(f"export {k}={shlex.quote(v)}" for k, v in env.items())
    return ["sh", "-c", PREP, "toolbox-ray-prep", folder, *node], {
        **env, "RAY_AUTH_TOKEN": token, "TOOLBOX_RAY_NODE_ENV": node_file}


def ray_dir(args, rank: int, info: HostInfo) -> str:
    return substitute([args.ray_dir], rank, info.host.destination, 0)[0]


def _console() -> Console:
    return Console(highlight=False, soft_wrap=True)


def _run(ssh, info: HostInfo, argv: list[str], env: dict[str, str], timeout: float = 240):
    proc = ssh.run(info.host, argv, env=env, timeout=timeout)
    return proc.returncode, (proc.stdout + proc.stderr).decode(errors="replace").strip()


def _prepare(args):
    from toolbox.cluster.app import _setup, _verify_same

    console = _console()
    hosts, ssh, prober, target = _setup(args)
    infos, master_addr = prober.probe_all(hosts)
    _verify_same(console, infos, args.engine, args.allow_mismatch)
    return console, ssh, infos, master_addr, target


def cmd_up(args: argparse.Namespace) -> int:
    console, ssh, infos, master_addr, target = _prepare(args)
    head = f"{master_addr}:{args.port}"
    token = cluster_token()
    nodes = [_node(args, info, rank, head, token, target) for rank, info in enumerate(infos)]

    def start(rank: int) -> tuple[int, str]:
        argv, env = nodes[rank]
        return _run(ssh, infos[rank], argv, env)

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
    console.print(f"cluster ray: on the head: RAY_AUTH_TOKEN_PATH={head_dir}/auth_token launch --launcher ray "
                  f"--address {head} --nodes {len(infos)} -- finetune --config train.yaml", markup=False)
    return 0


def cmd_down(args: argparse.Namespace) -> int:
    console, ssh, infos, _, target = _prepare(args)

    def stop(rank: int) -> tuple[int, str]:
        info = infos[rank]
        folder = ray_dir(args, rank, info)
        # On the host: the container's process (toolbx/distrobox share its process table) or the container.
        argv = (["sh", "-c", PODMAN_STOP, "toolbox-ray", folder, container_name(args, info)] if args.engine == "podman"
                else ["sh", "-c", STOP, "toolbox-ray", folder])
        return _run(ssh, info, argv, host_env(args), 90)

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
        folder = ray_dir(args, rank, info)
        then = []
        if rank == 0:  # `ray status` from the head, where Ray is installed
            ray_status = ["sh", "-c", RAY_STATUS, "toolbox-ray-status", folder, f"{master_addr}:{args.port}"]
            then = (["podman", "exec", container_name(args, info), *ray_status] if args.engine == "podman"
                    else wrap_engine(args.engine, target, info, {}, ray_status, args.transport, None))
        argv = (["sh", "-c", PODMAN_STATUS, "toolbox-ray", container_name(args, info), *then] if args.engine == "podman"
                else ["sh", "-c", STATUS, "toolbox-ray", folder, *then])
        code, out = _run(ssh, info, argv, host_env(args), 120)
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

    ray = sub.add_parser("ray", help="a Ray cluster on the hosts, for `launch --launcher ray` (up, status, down)")
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
