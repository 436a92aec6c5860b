"""`toolbox patches verify`: prove an RCCL patch series applies to its pinned upstream commit."""

from __future__ import annotations

from pathlib import Path

from toolbox.commands.options import add_stack
from toolbox.errors import UserError
from toolbox.rccl.patches import format_report, parse_series, verify


def _series_path(args) -> tuple[Path, str | None]:
    """The series file, and the commit the stack pins (when the series came from a stack)."""
    if args.series and args.stack:
        raise UserError("give --series or --stack, not both")
    if args.series:
        p = Path(args.series)
        return (p / "series" if p.is_dir() else p), None
    from toolbox.stack.load import load_stack  # noqa: PLC0415 (only needed on this path)

    stack = load_stack(args.stack)
    if stack.model.rccl is None or stack.rccl_patch_dir is None:
        raise UserError(f"stack {stack.model.name}: no rccl.patches series to verify")
    return stack.rccl_patch_dir / "series", stack.model.rccl.commit


def run_verify(args) -> int:
    series_file, stack_commit = _series_path(args)
    series = parse_series(series_file)
    commit = args.commit or stack_commit
    if stack_commit and series.base_commit and not stack_commit.startswith(series.base_commit) \
            and not series.base_commit.startswith(stack_commit):
        raise UserError(f"stack pins rccl.commit {stack_commit} but {series_file} records "
                        f"base-commit {series.base_commit}: make them agree")
    report = verify(Path(args.source), series, commit, keep=Path(args.keep) if args.keep else None)
    print(format_report(report))
    if args.keep and report.ok:
        print(f"patched tree kept in {args.keep}")
    return 0 if report.ok else 1


def register(sub) -> None:
    p = sub.add_parser("patches", help="patch series (RCCL for gfx1151)")
    psub = p.add_subparsers(dest="patches_command", metavar="SUBCOMMAND", required=True)
    v = psub.add_parser(
        "verify",
        help="apply a series to its pinned commit in a throw-away clone of DIR, report per patch",
        description="Clone DIR (sharing its objects; DIR itself is not modified), check out the "
        "pinned commit, then `git apply --check` and `git am` each patch in order. "
        "Exit 0 when all apply, 1 when one does not, 2 for bad input.",
    )
    v.add_argument("--source", required=True, metavar="DIR",
                   help="any git clone of the upstream repo that contains the commit")
    v.add_argument("--series", metavar="FILE|DIR", default=None,
                   help="a series file, or a folder holding one (default: the --stack's rccl.patches)")
    add_stack(v, "take the series and commit from it; default {default} when --series is not given")
    v.add_argument("--commit", metavar="SHA", default=None,
                   help="verify against this commit instead of the series' base-commit / the stack's rccl.commit")
    v.add_argument("--keep", metavar="DIR", default=None,
                   help="keep the patched tree here (must not exist) instead of deleting it")
    v.set_defaults(func=run_verify)
