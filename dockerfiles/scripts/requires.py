"""requires.py [--leave-out NAME,...] DIST...: the requirements of installed distributions, one a
line, for `pip install -r`: markers evaluated for this interpreter (no extras), the named ones
and the listed distributions themselves left out. An unlocked ROCm build installs PyPI Unsloth
--no-deps and then this list, so PyPI's triton/xformers never come in (toolbox/components/unsloth.py)."""

import sys
from importlib.metadata import PackageNotFoundError, distribution

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name


def main(argv: list[str]) -> int:
    leave: set[str] = set()
    if argv[:1] == ["--leave-out"]:
        leave = {canonicalize_name(n) for n in argv[1].split(",") if n}
        argv = argv[2:]
    if not argv:
        print(__doc__.splitlines()[0], file=sys.stderr)
        return 2
    dists = {canonicalize_name(d) for d in argv}
    out: dict[str, None] = {}
    for name in argv:
        try:
            reqs = distribution(name).requires or []
        except PackageNotFoundError:
            print(f"requires.py: {name} is not installed", file=sys.stderr)
            return 1
        for line in reqs:
            r = Requirement(line)
            n = canonicalize_name(r.name)
            if n in leave or n in dists or (r.marker is not None and not r.marker.evaluate({"extra": ""})):
                continue
            r.marker = None
            out[str(r)] = None
    sys.stdout.write("".join(f"{r}\n" for r in out))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
