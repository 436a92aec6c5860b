"""The CPU torchvision shim .ci/setup puts into the venv (.ci/torchvision_cpu.py, a .pth line): nothing imported at
interpreter start, and where a torchvision is installed it imports silently (the Qwen-VL processor tests need it)."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SHIM = "_toolbox_torchvision_cpu"  # .ci/setup's TV_SHIM


def _python(site: Path, code: str) -> subprocess.CompletedProcess:
    # the .pth runs as it does in the venv's site-packages: a site dir of its own, added as site.py adds them
    return subprocess.run([sys.executable, "-c", f"import site; site.addsitedir({str(site)!r})\n{code}"],
                          capture_output=True, text=True, timeout=300)


def test_the_shim_imports_nothing_until_torchvision(tmp_path):
    shutil.copy(ROOT / ".ci/torchvision_cpu.py", tmp_path / f"{SHIM}.py")
    (tmp_path / f"{SHIM}.pth").write_text(f"import {SHIM}; {SHIM}.install()\n")
    finders = "print(sum(type(f).__module__ == %r for f in sys.meta_path))" % SHIM
    r = _python(tmp_path, f"import sys; print('torch' in sys.modules); {finders}")
    assert r.returncode == 0 and r.stdout.split() == ["False", "1"], r.stderr
    if importlib.util.find_spec("torchvision") is None:
        return  # the rest needs a torchvision (.ci/setup venv installs one)
    r = _python(tmp_path, f"import torchvision.transforms.v2.functional, sys; {finders}")
    assert r.returncode == 0 and r.stderr == "", r.stderr
    assert r.stdout.split() == ["0"]  # stepped aside after the first import
