"""Make the suite's slow shared inputs once, before pytest (`make test` runs it; so does CI):

  base-image   debootstrap bookworm + podman import (the cpu stack's FROM; no registry in CI)
  cpu-image    the cpu stack's image, `toolbox build` with podman (llama.cpp compiled inside)
  llama-host   llama.cpp's tools for the host export tests (tests/export/llamacpp_build.py: from
               the cpu image's llama.cpp builder stage, adding the targets the image leaves out)
  ray-image    the cpu image plus ray[train] (tests/ray/test_ray_podman.py)

Each step prints its time ("phase ...", added to $PHASE_LOG as .ci/phase does) so a CI log shows
where the time went; the session fixtures call the same functions (helpers/prebuilt.py) and find
the work done. Usage: python tests/prebuild.py [STEP...] (all by default). Outside CI a step whose
tools are missing is skipped with a note (its tests skip too), and a failed step ends the prebuild
without failing `make test`; in CI (CI=true) a failure stops here.
"""

from __future__ import annotations

import os
import shutil
import sys
import time
from pathlib import Path

from _pytest.outcomes import OutcomeException  # what pytest.skip/fail raise (helpers.enginekit.need)

TESTS = Path(__file__).resolve().parent
for p in (str(TESTS), str(TESTS / "export"), str(TESTS.parent / "entrypoints")):
    if p not in sys.path:
        sys.path.insert(0, p)

IN_CI = os.environ.get("CI") == "true"


def _base():
    from helpers.prebuilt import ensure_base_image
    return ensure_base_image()


def _llama():
    import llamacpp_build
    return llamacpp_build.ensure_tools()


_built: dict[str, str] = {}


def _cpu():
    from helpers.prebuilt import build_cpu_image
    _built["cpu"] = build_cpu_image()["tag"]
    return _built["cpu"]


def _ray():
    from helpers.prebuilt import ensure_ray_image
    return ensure_ray_image(_built.get("cpu") or _cpu())


STEPS = {"base-image": _base, "cpu-image": _cpu, "llama-host": _llama, "ray-image": _ray}
NEEDS = {"base-image": ("podman", "debootstrap"), "llama-host": ("cmake", "c++"),
         "cpu-image": ("podman",), "ray-image": ("podman",)}


def phase(name: str, seconds: float, what: str) -> None:
    line = f"phase {name + ':':<14} {seconds:5.0f} s  ({what})"
    print(line, file=sys.stderr, flush=True)
    log = os.environ.get("PHASE_LOG")
    if log:
        with open(log, "a") as fh:
            fh.write(line + "\n")


def main(argv: list[str]) -> int:
    names = argv or list(STEPS)
    bad = [n for n in names if n not in STEPS]
    if bad:
        print(f"prebuild: unknown step {', '.join(bad)} (steps: {', '.join(STEPS)})", file=sys.stderr)
        return 2
    for name in names:
        missing = [t for t in NEEDS[name] if shutil.which(t) is None]
        if missing and not IN_CI:
            phase(name, 0, f"skipped: {', '.join(missing)} not installed")
            continue
        t0 = time.monotonic()
        try:
            got = STEPS[name]()
        except (Exception, OutcomeException) as exc:
            phase(name, time.monotonic() - t0, "failed")
            print(f"prebuild: {name} failed: {str(exc)[-4000:]}", file=sys.stderr)
            if IN_CI:
                return 1
            print("prebuild: the rest is left to the tests (those that need it fail or skip)", file=sys.stderr)
            return 0
        phase(name, time.monotonic() - t0, str(got))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
