"""`toolbox bench run|list|render`: the finetune benchmark harness (toolbox_train.bench).

The same harness ships in the images as the `bench` console script; on a host it needs the
`train` extra (and a GPU for the numbers; `--device cpu` runs the tiny shapes).
"""

from __future__ import annotations

from toolbox.errors import UserError


def register(sub) -> None:
    from toolbox_train import bench

    p = sub.add_parser("bench", help="benchmark finetune against bare loops and TRL (results.json, table, chart)")
    bench.build_parser(p)
    p.set_defaults(func=run)


def run(args) -> int:
    from toolbox_train import bench

    try:
        return bench.dispatch(args)
    except bench.BenchError as exc:
        raise UserError(str(exc)) from None
