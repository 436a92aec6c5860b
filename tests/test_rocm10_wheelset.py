"""The ROCm 10 set installs by URL and sha256 from no index (issue 38).

PyPI holds placeholders under names of AMD's set (rocm 0.1.0, rocm-sdk-core 0.1.0,
amd-torch-device-gfx115x 0.0.1.dev0, rocm-bootstrap 0.3.0): a name left to an index is a
name-confusion hazard. Here a local copy of AMD's layout (rocm/whl-next/<name>/<file>) holds tiny
real wheels and a real `rocm` sdist with the stack's names and versions, coupled as TheRock's are,
and a PyPI-like index on 127.0.0.1 holds the placeholders plus torch's one PyPI dependency. The
image's torch step, as the torch component renders it (toolbox.components.torch.closed_set), runs
with real pip in a real venv through dockerfiles/scripts/pip.sh: the pinned files are installed,
the closure check passes, and the last pip call takes only the PyPI dependency from the index.
Drop any one pin and the build stops at the closure check, naming it; the control shows that
without the check pip takes PyPI's placeholder.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import types
import zipfile
from pathlib import Path
from urllib.parse import unquote

import pytest
from packaging.utils import parse_sdist_filename, parse_wheel_filename

from helpers.httpd import serve_folder
from toolbox.components.torch import closed_set
from toolbox.rendering import render_dockerfile
from toolbox.errors import UserError
from toolbox.stack.load import load_stack, with_pins

ROOT = Path(__file__).resolve().parents[1]
PIP_SH = ROOT / "dockerfiles" / "scripts" / "pip.sh"
REQUIRES = ROOT / "dockerfiles" / "scripts" / "requires.py"


def coupling(T: str, TV: str, R: str, triton: str) -> dict[str, list[str]]:
    """How TheRock's metadata couples the set (torch's Requires-Dist, its [device-gfx1151] extra
    pulling the target's and the family's device wheels; the `rocm` sdist's [libraries] extra)."""
    return {
        "torch": ["sympy>=1.0", f"triton=={triton}", f"rocm[libraries]=={R}", "rocm-bootstrap",
                  f'amd-torch-device-gfx1151=={T}; extra == "device-gfx1151"',
                  f'amd-torch-device-gfx115x=={T}; extra == "device-gfx1151"'],
        "torchvision": [f"torch=={T}", f'amd-torchvision-device-gfx1151=={TV}; extra == "device-gfx1151"'],
        "torchaudio": [f"torch=={T}"],
        "amd-torch-device-gfx1151": [f"torch=={T}", f"rocm-sdk-device-gfx1151=={R}"],
        "amd-torch-device-gfx115x": [f"torch=={T}"],
        "rocm-sdk-libraries": [f"rocm-sdk-core=={R}"],
        "rocm-sdk-device-gfx1151": [f"rocm-sdk-core=={R}"],
    }


DEPS = coupling("2.13.0+rocm10.0.0", "0.28.0+rocm10.0.0", "10.0.0", "3.8.0+git4cff872c.rocm10.0.0")
# ROCm 10.1.0's (torch 2.14.0's metadata: triton==3.8.0+git669b31ac.rocm10.1.0, rocm[libraries]~=10.1.0)
DEPS_10_1 = coupling("2.14.0+rocm10.1.0", "0.29.0a0+rocm10.1.0", "10.1.0", "3.8.0+git669b31ac.rocm10.1.0")
PLACEHOLDERS = {"rocm": "0.1.0", "rocm-sdk-core": "0.1.0", "amd-torch-device-gfx115x": "0.0.1.dev0",
                "rocm-bootstrap": "0.3.0", "sympy": "1.0"}  # the last: torch's real PyPI dependency
CLEAN_ENV = {"PATH": "/usr/bin:/bin", "PIP_CONFIG_FILE": "/dev/null", "PIP_NO_CACHE_DIR": "1",
             "PIP_DISABLE_PIP_VERSION_CHECK": "1"}


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


def installed_wheel(name: str) -> tuple[str, bytes]:
    """An installed distribution packed back into a wheel from its RECORD (a setuptools that has
    bdist_wheel, >= 70.1, as the stack's 84.2.1 has: the ones Python bundles are older)."""
    from importlib.metadata import distribution

    d = distribution(name)
    base = Path(d.locate_file(""))
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        for f in d.files:
            if "__pycache__" not in f.parts and not str(f).startswith(".."):
                zf.write(base / f, str(f))
    return f"{name}-{d.version}-py3-none-any.whl", buf.getvalue()


def rocm_sdist(version: str) -> bytes:
    """The `rocm` meta package as TheRock ships it: an sdist whose setup.py picks the GPU family
    (here it refuses to guess: the real one asks offload-arch, which a build has no GPU for)."""
    setup = ("import os\nfrom setuptools import setup\n"
             "assert os.environ.get('ROCM_SDK_TARGET_FAMILY'), 'no GPU here: set ROCM_SDK_TARGET_FAMILY'\n"
             f"setup(name='rocm', version='{version}', py_modules=[], "
             f"install_requires=['rocm-sdk-core=={version}'], "
             f"extras_require={{'libraries': ['rocm-sdk-libraries=={version}']}})\n")
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tf:
        for path, text in {"setup.py": setup, "PKG-INFO": f"Metadata-Version: 2.1\nName: rocm\nVersion: {version}\n"}.items():
            data = text.encode()
            info = tarfile.TarInfo(f"rocm-{version}/{path}")
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    return buf.getvalue()


@pytest.fixture(scope="module")
def amd(tmp_path_factory):
    return layout(tmp_path_factory.mktemp("amd") / "rocm" / "whl-next", "gfx1151-rocm10.0", DEPS)


def layout(root: Path, stack: str, deps: dict) -> dict[str, str]:
    """{name: 'file://...#sha256=...'}: the stack's every pin as a local file of the same name and
    version under rocm/whl-next/<name>/; setuptools is this interpreter's own, packed as a wheel."""
    refs = {}
    for name, ref in load_stack(stack).model.torch.wheels.items():
        file = unquote(ref.partition("#")[0].rsplit("/", 1)[1])
        if name == "setuptools":
            filename, data = installed_wheel("setuptools")
        elif file.endswith(".tar.gz"):
            version = str(parse_sdist_filename(file)[1])
            filename, data = file, rocm_sdist(version)
        else:
            version = str(parse_wheel_filename(file)[1])
            filename, data = wheel(name, version, deps.get(name, []))
        d = root / name
        d.mkdir(parents=True, exist_ok=True)
        (d / filename).write_bytes(data)
        refs[name] = f"{(d / filename).as_uri()}#sha256={hashlib.sha256(data).hexdigest()}"
    return refs


@pytest.fixture(scope="module")
def pypi(tmp_path_factory):
    root = tmp_path_factory.mktemp("pypi")
    for name, version in PLACEHOLDERS.items():
        d = root / "simple" / name
        d.mkdir(parents=True)
        filename, data = wheel(name, version, [])
        (d / filename).write_bytes(data)
    with serve_folder(root) as url:
        yield f"{url}/simple/"


@pytest.fixture(scope="module")
def base_venv(tmp_path_factory):
    venv = tmp_path_factory.mktemp("venv") / "v"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120, capture_output=True)
    # this venv's pip, not the one the base interpreter bundles: Debian's python3.11 seeds pip 23.0.1, which
    # installs the `rocm` sdist by a legacy `setup.py install` (no direct_url.json) where `wheel` is missing
    name, data = installed_wheel("pip")
    whl = venv.parent / name
    whl.write_bytes(data)
    subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "--no-index", "--no-deps", str(whl)],
                   check=True, timeout=120, capture_output=True, env=CLEAN_ENV)
    return venv


def steps(refs: dict[str, str], stack: str = "gfx1151-rocm10.0") -> dict:
    """closed_set() of the shipped stack with each URL swapped for its local copy."""
    s = load_stack(stack)
    torch = s.model.torch.model_copy(update={"wheels": refs})
    return closed_set(types.SimpleNamespace(model=s.model.model_copy(update={"torch": torch})))


def run_step(venv: Path, pypi: str, refs: dict[str, str], tmp_path: Path,
             stack: str = "gfx1151-rocm10.0") -> tuple[subprocess.CompletedProcess, dict]:
    """The torch step: setuptools, the set (--no-index), the closure check, torch's PyPI deps."""
    st = steps(refs, stack)
    py = str(venv / "bin" / "python")
    env = {**CLEAN_ENV, "TOOLBOX_PYTHON": py, "TOOLBOX_WHEELHOUSE": str(tmp_path / "no-wheelhouse"),
           "PIP_INDEX_URL": pypi}
    sh = ["sh", str(PIP_SH), "install"]
    if st["setuptools"]:
        subprocess.run([*sh, *st["setuptools"]], env=env, check=True, capture_output=True, timeout=120)
    a = subprocess.run([*sh, *st["install"]], env={**env, **st["env"]}, capture_output=True, text=True, timeout=300)
    assert a.returncode == 0, a.stderr
    check = subprocess.run([py, str(REQUIRES), *st["check"]], env=env, capture_output=True, text=True, timeout=60)
    if check.returncode != 0:
        return check, {}
    report = tmp_path / "report.json"
    b = subprocess.run([*sh, "--report", str(report), *(r.strip("'") for r in st["check"][1:])],
                       env=env, capture_output=True, text=True, timeout=120)
    assert b.returncode == 0, b.stderr
    return check, {i["metadata"]["name"]: i["metadata"]["version"] for i in json.loads(report.read_text())["install"]}


def installed(venv: Path) -> dict[str, tuple[str, bool]]:
    out = subprocess.run([str(venv / "bin" / "python"), "-c",
                          "import importlib.metadata as m, json; print(json.dumps({d.metadata['Name']: "
                          "[d.version, d.read_text('direct_url.json') is not None] for d in m.distributions()}))"],
                         capture_output=True, text=True, check=True)
    return {k: tuple(v) for k, v in json.loads(out.stdout).items()}


def test_the_rendered_step_asks_no_index_for_the_rocm_set():
    s = load_stack("gfx1151-rocm10.0")
    step = render_dockerfile(s)
    step = step[step.index("# torch 2.13.0+rocm10.0.0"):step.index("# Every other librccl")]
    assert "--torch-index" not in step and "--extra-index-url" not in step
    st = closed_set(s)
    assert st["install"][:3] == ["--no-index", "--no-deps", "--no-build-isolation"]
    assert st["setuptools"][:2] == ["--no-index", "--no-deps"]
    # every pin is in the --no-index call, each by URL and sha256
    assert len(st["install"]) - 3 == len(s.model.torch.wheels) - 1 and all(" @ " in r and "#sha256=" in r for r in st["install"][3:])
    assert "ROCM_SDK_TARGET_FAMILY=gfx1151" in step and "requires.py --closed" in step


def test_the_pinned_set_installs_from_its_urls_and_pypi_gives_only_torchs_own_dependency(amd, pypi, base_venv, tmp_path):
    venv = tmp_path / "v"
    shutil.copytree(base_venv, venv, symlinks=True)
    check, from_index = run_step(venv, pypi, amd, tmp_path)
    assert check.returncode == 0, check.stderr
    assert from_index == {"sympy": "1.0"}, from_index  # no placeholder: the whole set was there
    got = installed(venv)
    for name, ref in amd.items():
        file = unquote(ref.partition("#")[0].rsplit("/", 1)[1])
        version = str((parse_sdist_filename(file) if file.endswith(".tar.gz") else parse_wheel_filename(file))[1])
        assert got.get(name) == (version, True) or (name == "setuptools" and got.get(name, ("",))[0] == version), name
    assert "requires.py: left to PyPI: sympy>=1.0" in check.stdout


DROPPABLE = ["torch", "torchvision", "torchaudio", "amd-torch-device-gfx1151", "amd-torch-device-gfx115x",
             "amd-torchvision-device-gfx1151", "triton", "rocm", "rocm-bootstrap", "rocm-sdk-core",
             "rocm-sdk-libraries", "rocm-sdk-device-gfx1151"]


def test_every_pin_of_the_set_is_tested_here(amd):
    assert set(DROPPABLE) | {"setuptools"} == set(amd)


@pytest.mark.parametrize("dropped", DROPPABLE)
def test_a_pin_left_to_an_index_stops_the_build(amd, dropped, tmp_path):
    """--target install of the set less one pin (as the image step runs it), then the closure check:
    one or the other stops the build, naming the missing package."""
    refs = {n: r for n, r in amd.items() if n != dropped}
    st = steps(refs)
    if st is None:  # torch or the rocm sdist gone: the stack is no closed set, the index step renders
        assert dropped in ("torch", "rocm")
        return
    env = {**CLEAN_ENV, "TOOLBOX_PYTHON": sys.executable, "TOOLBOX_WHEELHOUSE": str(tmp_path / "none"), **st["env"]}
    target = tmp_path / "t"
    a = subprocess.run(["sh", str(PIP_SH), "install", "--target", str(target), *st["install"]],
                       env=env, capture_output=True, text=True, timeout=300)
    if a.returncode != 0:  # torchvision, torchaudio: left as a version, which --no-index cannot find
        assert f"No matching distribution found for {dropped}==" in a.stderr, a.stderr
        return
    check = subprocess.run([sys.executable, str(REQUIRES), *st["check"][:1], "--path", str(target), *st["check"][1:]],
                           capture_output=True, text=True, timeout=60, env=CLEAN_ENV)
    assert check.returncode == 1, check.stdout
    assert f"no pinned URL supplies {dropped}" in check.stderr, check.stderr


def test_control_without_the_check_pip_takes_pypis_placeholder(amd, pypi, base_venv, tmp_path):
    venv = tmp_path / "v"
    shutil.copytree(base_venv, venv, symlinks=True)
    refs = {n: r for n, r in amd.items() if n != "rocm-bootstrap"}
    st = steps(refs)
    env = {**CLEAN_ENV, "TOOLBOX_PYTHON": str(venv / "bin" / "python"), "TOOLBOX_WHEELHOUSE": str(tmp_path / "none"),
           "PIP_INDEX_URL": pypi}
    subprocess.run(["sh", str(PIP_SH), "install", *st["setuptools"]], env=env, check=True, capture_output=True)
    subprocess.run(["sh", str(PIP_SH), "install", *st["install"]], env={**env, **st["env"]}, check=True, capture_output=True)
    subprocess.run(["sh", str(PIP_SH), "install", *st["check"][1:]], env=env, check=True, capture_output=True)
    assert installed(venv)["rocm-bootstrap"] == ("0.3.0", False)  # the hazard the check stops


# ROCm 10.1.0: the same set by URL, with the sha256s left to first use (no record gives them).
AMD = "https://stable.repo.amd.com/rocm/"


def therock_tarball(commit: str) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tf:
        data = json.dumps({"submodules": [{"path": "rocm-systems", "commit": commit}]}).encode()
        info = tarfile.TarInfo("share/therock/therock_manifest.json")
        info.size = len(data)
        tf.addfile(info, io.BytesIO(data))
    return buf.getvalue()


@pytest.fixture()
def first_use(tmp_path, monkeypatch):
    """The shipped 10.1 stack's first-use pins, AMD's files standing in locally: (stack pinned,
    {name: local file URI}, the pins file). Only the download is redirected (no internet here)."""
    from toolbox.stack import pinning

    s = load_stack("gfx1151-rocm10.1")
    local = layout(tmp_path / "amd" / "rocm" / "whl-next", "gfx1151-rocm10.1", DEPS_10_1)
    by_url = {s.model.torch.wheels[n].partition("#")[0]: r.partition("#")[0] for n, r in local.items()}
    tarball = tmp_path / "rocm-10.1.0.tar.gz"
    tarball.write_bytes(therock_tarball("c0ffee" + "0" * 34))
    by_url[s.model.rocm.tarball.url] = tarball.as_uri()
    real = pinning.download
    monkeypatch.setattr(pinning, "download", lambda url, dest, **kw: real(by_url[url], dest, **kw))
    monkeypatch.setenv("TOOLBOX_CACHE_DIR", str(tmp_path / "cache"))
    pins = pinning.PinsFile(tmp_path / "pins.lock.json")
    with pytest.raises(UserError, match=r"^--frozen: rocm.tarball .*10.1.0.tar.gz has no sha256"):
        pinning.first_use_pins(s, frozen=True, pins_file=pins, probe=lambda ref: "sha256:" + "0" * 64)
    updates = pinning.first_use_pins(s, pins_file=pins, probe=lambda ref: "sha256:" + "0" * 64)
    return with_pins(s, updates), {n: r.partition("#")[0] for n, r in local.items()}, pins


def test_10_1_ships_the_whole_set_by_url_with_first_use_sha256s():
    s = load_stack("gfx1151-rocm10.1")
    assert set(s.model.torch.wheels) == set(load_stack("gfx1151-rocm10.0").model.torch.wheels)
    for name, ref in s.model.torch.wheels.items():
        if name == "setuptools":
            continue
        assert ref.startswith(f"{AMD}whl-next/{name}/"), name
        assert ("#sha256=" in ref) == (name == "rocm-bootstrap"), name  # its file is 10.0's
    step = " ".join(closed_set(s)["install"])
    assert step.count("#sha256=UNVERIFIED") == 11 and "+rocm10.0.0" not in step  # rendered so no file matches
    assert s.unverified_pins() == ["base", "rccl", "rocm.tarball", "torch"]


def test_10_1_first_use_pins_the_set_and_pip_installs_it_from_no_index(first_use, pypi, base_venv, tmp_path):
    pinned, local, pins = first_use
    assert pinned.unverified_pins() == [] and pinned.model.rccl.commit == "c0ffee" + "0" * 34
    refs = {}
    for name, ref in pinned.model.torch.wheels.items():
        url, _, sha = ref.partition("#sha256=")
        data = Path(unquote(local[name].removeprefix("file://"))).read_bytes()
        if name not in ("rocm-bootstrap", "setuptools"):  # these two keep their recorded sha256s
            assert sha == hashlib.sha256(data).hexdigest() and url.startswith(AMD), name
        refs[name] = f"{local[name]}#sha256={hashlib.sha256(data).hexdigest() if name in ('rocm-bootstrap', 'setuptools') else sha}"
    venv = tmp_path / "v"
    shutil.copytree(base_venv, venv, symlinks=True)
    check, from_index = run_step(venv, pypi, refs, tmp_path, "gfx1151-rocm10.1")
    assert check.returncode == 0, check.stderr
    assert from_index == {"sympy": "1.0"}, from_index
    assert installed(venv)["triton"] == ("3.8.0+git669b31ac.rocm10.1.0", True)


def test_10_1_first_use_pins_are_refused_when_the_bytes_change(first_use, tmp_path):
    from toolbox.stack import pinning

    pinned, local, pins = first_use
    triton = Path(unquote(local["triton"].removeprefix("file://")))
    triton.write_bytes(triton.read_bytes() + b"\0")  # AMD's file replaced after the first build
    again = with_pins(load_stack("gfx1151-rocm10.1"), pinning.first_use_pins(
        load_stack("gfx1151-rocm10.1"), frozen=True, pins_file=pinning.PinsFile(pins.path)))
    assert again.model.torch.wheels == pinned.model.torch.wheels  # the recorded sha256s, with no download
    refs = {n: f"{local[n]}#sha256={r.partition('#sha256=')[2]}" for n, r in again.model.torch.wheels.items()
            if n not in ("rocm-bootstrap", "setuptools")}
    st = steps({**refs, **{n: r for n, r in layout(tmp_path / "x", "gfx1151-rocm10.1", DEPS_10_1).items()
                           if n in ("rocm-bootstrap", "setuptools")}}, "gfx1151-rocm10.1")
    env = {**CLEAN_ENV, "TOOLBOX_PYTHON": sys.executable, "TOOLBOX_WHEELHOUSE": str(tmp_path / "none"), **st["env"]}
    a = subprocess.run(["sh", str(PIP_SH), "install", "--target", str(tmp_path / "t"), *st["install"]],
                       env=env, capture_output=True, text=True, timeout=300)
    assert a.returncode != 0 and "DO NOT MATCH THE HASHES" in a.stderr, a.stderr


def test_10_1_build_frozen_refuses_before_its_pins_are_recorded(tmp_path):
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{ROOT / 'entrypoints'}",
           "TOOLBOX_STATE_DIR": str(tmp_path / "state"), "TOOLBOX_CACHE_DIR": str(tmp_path / "cache")}
    cp = subprocess.run([sys.executable, "-m", "toolbox", "build", "--stack", "gfx1151-rocm10.1", "--frozen",
                         "--dry-run"], capture_output=True, text=True, env=env, timeout=300, cwd=ROOT)
    assert cp.returncode == 2 and len(cp.stderr.strip().splitlines()) == 1, cp.stderr
    assert "--frozen: rocm.tarball https://stable.repo.amd.com/rocm/core/tarball/therock-dist-linux-gfx1151-10.1.0" \
           ".tar.gz has no sha256 and is not in the pins file" in cp.stderr
