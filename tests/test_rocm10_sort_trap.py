"""The sort trap of ROCm 10 (TheRock docs/packaging/versioning.md, #7183): pip and uv compare local
versions segment by segment, "rocm10" and "rocm7" as text, so 2.13.0+rocm10.0.0 sorts BELOW
2.13.0+rocm7.15.0a20260728. With both lines on one index, anything but an exact local version on
every coupled package can put a 7.x wheel into a 10.x image.

A real PEP 503 index on 127.0.0.1 holds both lines of torch, torchvision, torchaudio, triton,
the gfx1151 device wheels and rocm-sdk-*, as real (tiny) wheels whose metadata couple them the
way TheRock's do. Real pip and uv resolve the gfx1151-rocm10.0 stack's own requirements there:
only rocm10 builds may come out. The control shows the trap is live on that index (a bare
torch==2.13.0 gets the 7.15 build), so the test fails if the stack's pins stop being exact.
That the image installs the whole set by URL from no index is tests/test_rocm10_wheelset.py.
"""

from __future__ import annotations

import io
import json
import shutil
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest

from helpers.httpd import serve_folder
from toolbox.components.torch import requirements
from toolbox.stack.load import load_stack
from toolbox.stack.python_lock import lock_path

ROOT = Path(__file__).resolve().parents[1]
R10, R7 = "rocm10.0.0", "rocm7.15.0a20260728"


def line(local: str) -> dict[str, tuple[str, list[str]]]:
    """One ROCm line's wheels: name -> (version, Requires-Dist lines), coupled by exact versions."""
    sdk = "10.0.0" if local == R10 else "7.15.0a20260728"
    torch_deps = [f"triton==3.8.0+git4cff872c.{local}", f"rocm-sdk-core=={sdk}", f"rocm-sdk-libraries=={sdk}",
                  f'amd-torch-device-gfx1151==2.13.0+{local}; extra == "device-gfx1151"',
                  f'rocm-sdk-device-gfx1151=={sdk}; extra == "device-gfx1151"']
    return {
        "torch": (f"2.13.0+{local}", torch_deps),
        "torchvision": (f"0.28.0+{local}", [f"torch==2.13.0+{local}",
                                            f'amd-torchvision-device-gfx1151==0.28.0+{local}; extra == "device-gfx1151"']),
        "torchaudio": (f"2.11.0.2+{local}", [f"torch==2.13.0+{local}"]),
        "triton": (f"3.8.0+git4cff872c.{local}", []),
        "amd-torch-device-gfx1151": (f"2.13.0+{local}", [f"torch==2.13.0+{local}"]),
        "amd-torchvision-device-gfx1151": (f"0.28.0+{local}", []),
        "rocm-sdk-core": (sdk, []),
        "rocm-sdk-libraries": (sdk, [f"rocm-sdk-core=={sdk}"]),
        "rocm-sdk-device-gfx1151": (sdk, [f"rocm-sdk-core=={sdk}"]),
    }


def wheel(name: str, version: str, deps: list[str]) -> tuple[str, bytes]:
    dist = f"{name.replace('-', '_')}-{version}"
    extras = sorted({d.split('extra == "')[1].rstrip('"') for d in deps if "extra ==" in d})
    meta = "".join([f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
                    *(f"Provides-Extra: {e}\n" for e in extras), *(f"Requires-Dist: {d}\n" for d in deps)])
    files = {f"{dist}.dist-info/METADATA": meta,
             f"{dist}.dist-info/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        for path, text in files.items():
            zf.writestr(path, text)
        zf.writestr(f"{dist}.dist-info/RECORD", "".join(f"{p},,\n" for p in [*files, f"{dist}.dist-info/RECORD"]))
    return f"{dist}-py3-none-any.whl", buf.getvalue()


@pytest.fixture(scope="module")
def index(tmp_path_factory):
    root = tmp_path_factory.mktemp("amd-index")
    for local in (R7, R10):
        for name, (version, deps) in line(local).items():
            d = root / "simple" / name
            d.mkdir(parents=True, exist_ok=True)
            filename, data = wheel(name, version, deps)
            (d / filename).write_bytes(data)
    with serve_folder(root) as url:
        yield f"{url}/simple/"


def pip_resolve(index: str, reqs: list[str], tmp_path: Path) -> dict[str, str]:
    """What pip would install for reqs from this one index alone: {name: version}."""
    report = tmp_path / "report.json"
    r = subprocess.run([sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet",
                        "--no-cache-dir", "--disable-pip-version-check", "--index-url", index, "--report", str(report),
                        *reqs], capture_output=True, text=True, timeout=120,
                       env={"PATH": "/usr/bin:/bin", "PIP_CONFIG_FILE": "/dev/null"})
    assert r.returncode == 0, r.stderr
    return {i["metadata"]["name"]: i["metadata"]["version"] for i in json.loads(report.read_text())["install"]}


def test_the_trap_is_live_on_this_index(index, tmp_path):
    # Control: what a loose pin does here. Without it the test below would prove nothing.
    got = pip_resolve(index, ["torch[device-gfx1151]==2.13.0", "torchaudio==2.11.0.2"], tmp_path)
    assert got["torch"] == f"2.13.0+{R7}" and got["torchaudio"] == f"2.11.0.2+{R7}"
    assert got["rocm-sdk-core"] == "7.15.0a20260728"


def test_pip_installs_only_rocm10_builds_from_the_stacks_requirements(index, tmp_path):
    reqs = requirements(load_stack("gfx1151-rocm10.0"))
    got = pip_resolve(index, reqs, tmp_path)
    assert set(got) == set(line(R10)), got  # every coupled package, device wheels included
    assert all(v == line(R10)[n][0] for n, v in got.items()), got
    # ...and an upgrade of what is there cannot move it either (pip's --upgrade compares as text too).
    assert pip_resolve(index, ["--upgrade", *reqs], tmp_path) == got


@pytest.mark.skipif(shutil.which("uv") is None and not Path(sys.executable).with_name("uv").exists(), reason="needs uv")
def test_uv_resolves_only_rocm10_builds_too(index, tmp_path):
    uv = shutil.which("uv") or str(Path(sys.executable).with_name("uv"))
    reqs = requirements(load_stack("gfx1151-rocm10.0"))
    r = subprocess.run([uv, "pip", "compile", "-", "--index-url", index, "--no-header", "--quiet",
                        "--cache-dir", str(tmp_path / "uv-cache"), "--python-version", "3.13"],
                       input="\n".join(reqs) + "\n", capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    pins = dict(ln.split("==", 1) for ln in r.stdout.splitlines() if "==" in ln and not ln.startswith(" "))
    assert pins["torch"] == f"2.13.0+{R10}" and pins["amd-torch-device-gfx1151"] == f"2.13.0+{R10}"
    assert not [ln for ln in r.stdout.splitlines() if "rocm7" in ln or "7.15.0a" in ln], r.stdout


def test_the_python_lock_holds_no_amd_wheel():
    # The checked-in lock is PyPI's set: torch and everything coupled to it stay out of it (the
    # image takes them from the stack's wheel URLs and AMD's index), so no 7.x can come from there.
    text = lock_path(load_stack("gfx1151-rocm10.0")).read_text()
    assert "rocm7" not in text and "# first-use: torch[device-gfx1151]==2.13.0+rocm10.0.0 " in text
    names = {ln.split("==", 1)[0] for ln in text.splitlines() if "==" in ln and not ln.startswith(("#", " "))}
    assert not names & set(line(R10)), names & set(line(R10))


@pytest.mark.parametrize("value,why", [
    ('">=2.13"', "must be an exact version"),
    ('"2.13.*"', "must be an exact version"),
    ('"2.13.0"', "2.13.0 has no local version"),
    ('"2.13.0+rocm7.15.0a20260728"', "names +rocm7.15.0a20260728"),
    ('"2.14.0+rocm10.1.0"', "names +rocm10.1.0"),
])
def test_a_loose_torch_pin_on_rocm10_is_refused(tmp_path, value, why):
    p = tmp_path / "s.yaml"
    p.write_text(textwrap.dedent(f"""\
        extends: gfx1151-rocm10.0
        torch:
          torch: {value}
          wheels: {{}}
        """))
    r = subprocess.run([sys.executable, "-m", "toolbox", "render", "--stack", str(p)], cwd=ROOT,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "Traceback" not in r.stderr and r.stdout == ""
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert f"{p}:3: torch.torch" in r.stderr and why in r.stderr, r.stderr
