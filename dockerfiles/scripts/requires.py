"""requires.py [--leave-out NAME,...] DIST...: the requirements of installed distributions, one a
line, for `pip install -r`: markers evaluated for this interpreter (no extras), the named ones
and the listed distributions themselves left out. An unlocked ROCm build installs PyPI Unsloth
--no-deps and then this list, so PyPI's triton/xformers never come in (toolbox/components/unsloth.py).

requires.py --closed [--path DIR] REQ...: the ROCm set the torch step installed by URL with
--no-deps is whole: each REQ (torch[device-gfx1151]==2.13.0+rocm10.0.0, ...) is installed at its
version, and so is every requirement a wheel of the set has on a ROCm name (torch*, triton, rocm,
rocm-*, amd-*), with the extras asked of it; exit 1 naming each one no pinned URL supplied (the
next pip step would take it from an index: PyPI holds placeholders named rocm, rocm-sdk-core,
amd-torch-device-gfx115x, rocm-bootstrap). Prints the set, then what it leaves to PyPI."""

import re
import sys
from importlib.metadata import PackageNotFoundError, distribution, distributions

try:
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name
except ImportError:  # the torch step runs before anything but pip is in the venv
    from pip._vendor.packaging.requirements import Requirement
    from pip._vendor.packaging.utils import canonicalize_name

ROCM_NAME = re.compile(r"^(torch|torchvision|torchaudio|triton|rocm|rocm-.+|amd-.+)$")


def closed(argv: list[str]) -> int:
    path = None
    if argv[:1] == ["--path"]:
        path, argv = [argv[1]], argv[2:]

    def find(name: str):
        found = [d for d in distributions(path=path) if canonicalize_name(d.metadata["Name"] or "") == name] \
            if path else [d for d in [_dist(name)] if d is not None]
        return found[0] if found else None

    queue = [Requirement(a) for a in argv]
    seen: dict[str, str] = {}
    pypi: dict[str, None] = {}
    missing: list[str] = []
    while queue:
        req = queue.pop(0)
        name = canonicalize_name(req.name)
        key = f"{name}[{','.join(sorted(req.extras))}]"
        if key in seen:
            continue
        dist = find(name)
        if dist is None or not req.specifier.contains(dist.version, prereleases=True):
            got = "not installed" if dist is None else f"installed at {dist.version}"
            missing.append(f"{req} ({got}, wanted by {seen.get('_by_' + name, 'the stack')})")
            seen[key] = "missing"
            continue
        seen[key] = dist.version
        for line in dist.requires or []:
            child = Requirement(line)
            envs = [{"extra": e} for e in (req.extras or {""})] + [{"extra": ""}]
            if child.marker is not None and not any(child.marker.evaluate(e) for e in envs):
                continue
            child.marker = None
            if ROCM_NAME.match(canonicalize_name(child.name)):
                seen.setdefault("_by_" + canonicalize_name(child.name), f"{name} {dist.version}")
                queue.append(child)
            else:
                pypi[str(child)] = None
    for key, version in seen.items():
        if not key.startswith("_by_") and version != "missing":
            print(f"requires.py: ROCm set: {key} {version}")
    for r in pypi:
        print(f"requires.py: left to PyPI: {r}")
    for m in missing:
        print(f"requires.py: no pinned URL supplies {m}: pin it in the stack's torch.wheels "
              "(URL#sha256=...), or an index would", file=sys.stderr)
    return 1 if missing else 0


def _dist(name: str):
    try:
        return distribution(name)
    except PackageNotFoundError:
        return None


def main(argv: list[str]) -> int:
    if argv[:1] == ["--closed"]:
        return closed(argv[1:])
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
