"""`toolbox cluster launch|check`: start, watch and stop a training job on several hosts over SSH."""

from __future__ import annotations

import argparse


def register(subparsers) -> None:
    from toolbox.argtypes import count, size_mib
    from toolbox.cluster import app

    p = subparsers.add_parser("cluster", help="multi-node training over SSH (launch, check, ray)")
    sub = p.add_subparsers(dest="cluster_command", metavar="ACTION", required=True)

    launch = sub.add_parser("launch", help="run `launch ... -- COMMAND` on every host, master first",
                            description="Runs the command after `--` on every host through `launch` with "
                            "--nnodes/--node-rank/--master-addr set; {node_rank}, {host} and {nnodes} in it "
                            "are replaced per host.")
    app.add_common(launch)
    launch.add_argument("--resume", action="store_true", help="append --resume to the finetune command")
    launch.add_argument("command", nargs=argparse.REMAINDER, help="-- finetune --config train.yaml")
    launch.set_defaults(func=app.cmd_launch)

    check = sub.add_parser("check", help="SSH, same image, interface/MTU, and an all-reduce across the hosts")
    app.add_common(check)
    check.add_argument("--size-mib", type=size_mib, default=16.0, help="all-reduce buffer size for the bandwidth figure")
    check.add_argument("--iters", type=count, default=10)
    check.set_defaults(func=app.cmd_check)

    from toolbox.cluster import ray_nodes

    ray_nodes.register(sub)  # `cluster ray up|status|down`
