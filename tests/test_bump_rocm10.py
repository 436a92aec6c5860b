"""`toolbox bump rocm|torch` on ROCm 10's stable repository layout, against a local HTTP copy of it
(127.0.0.1): tarballs in core/tarball/, wheels behind whl-next/, which redirects each project to
pytorch/whl-next/ (torch, torchvision, torchaudio, amd-torch-device-*) or core/whl-next/ (rocm-sdk-*),
as AMD's does. Both ROCm lines sit on the one index, so the sort trap is there to fall into:
"+rocm10.0.0" < "+rocm7.15.0a..." as text, and bump must never pick a 7.x wheel for a 10.x stack.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
import urllib.parse
from pathlib import Path

import pytest

from helpers.httpd import Quiet, self_signed, serve_folder
from toolbox.errors import UserError
from toolbox.paths import STACKS_DIR
from toolbox.stack.bumping import bump
from toolbox.stack.load import load_stack

ROOT = Path(__file__).resolve().parents[1]
LINUX = "linux_x86_64"
TARBALLS = ["gfx1151-7.14.0", "gfx1151-7.15.0a20260728", "gfx1151-10.0.0", "gfx1151-10.0.1",
            "gfx1151-10.1.0rc1", "gfx1151-10.1.0", "gfx110X-all-10.9.0"]
PYTORCH = {
    "torch": ["torch-2.13.0+rocm10.0.0-cp313-cp313-" + LINUX, "torch-2.13.0+rocm10.0.0-cp312-cp312-" + LINUX,
              # the 7.x line beside it: as text rocm7.15... sorts above rocm10.0.0
              "torch-2.13.0+rocm7.15.0a20260728-cp313-cp313-" + LINUX,
              "torch-2.14.0+rocm7.15.0a20260728-cp313-cp313-" + LINUX,
              "torch-2.14.0+rocm10.1.0-cp313-cp313-" + LINUX],  # another 10.x release
    "torchvision": ["torchvision-0.28.0+rocm10.0.0-cp313-cp313-" + LINUX,
                    "torchvision-0.28.0+rocm7.15.0a20260728-cp313-cp313-" + LINUX,
                    "torchvision-0.29.0+rocm7.15.0a20260728-cp313-cp313-" + LINUX],
    "torchaudio": ["torchaudio-2.11.0.2+rocm10.0.0-cp313-cp313-" + LINUX,
                   "torchaudio-2.13.0+rocm7.15.0a20260728-cp313-cp313-" + LINUX,
                   "torchaudio-2.14.0+rocm10.1.0-cp313-cp313-" + LINUX],
    "amd-torch-device-gfx1151": ["amd_torch_device_gfx1151-2.13.0+rocm10.0.0-cp313-cp313-" + LINUX,
                                 "amd_torch_device_gfx1151-2.13.0+rocm7.15.0a20260728-cp313-cp313-" + LINUX],
    # the rest of 10.0.0's coupled set, as gfx1151-rocm10.0 pins it
    "amd-torch-device-gfx115x": ["amd_torch_device_gfx115x-2.13.0+rocm10.0.0-cp313-cp313-" + LINUX],
    "amd-torchvision-device-gfx1151": ["amd_torchvision_device_gfx1151-0.28.0+rocm10.0.0-cp313-cp313-" + LINUX],
    "triton": ["triton-3.8.0+git4cff872c.rocm10.0.0-cp313-cp313-" + LINUX,
               "triton-3.8.0+git1d2e3f4a.rocm7.15.0a20260728-cp313-cp313-" + LINUX],
}
CORE = {"rocm-sdk-device-gfx1151": ["rocm_sdk_device_gfx1151-10.0.0-py3-none-" + LINUX],
        "rocm-sdk-core": ["rocm_sdk_core-10.0.0-py3-none-" + LINUX],
        "rocm-sdk-libraries": ["rocm_sdk_libraries-10.0.0-py3-none-" + LINUX],
        "rocm": ["rocm-10.0.0.tar.gz"]}


class Repo(Quiet):
    """A static file tree plus AMD's whl-next/ redirect."""

    def send_head(self):
        if self.path.startswith("/rocm/whl-next/"):
            rest = self.path[len("/rocm/whl-next/"):]
            project = rest.split("/", 1)[0]
            where = "pytorch" if (Path(self.directory) / "rocm" / "pytorch" / "whl-next" / project).is_dir() else "core"
            self.send_response(301)
            self.send_header("Location", f"/rocm/{where}/whl-next/{rest}")
            self.end_headers()
            return None
        return super().send_head()


@pytest.fixture()
def repo(tmp_path, request, monkeypatch):
    """AMD's layout on 127.0.0.1: over http, or https where the test asks (`tls` in its name: the
    ROCm set's coupled wheels must be https URLs), with its certificate trusted."""
    tls = self_signed(tmp_path / "tls") if "tls" in request.node.name else None
    if tls is not None:
        monkeypatch.setenv("SSL_CERT_FILE", str(tls / "cert.pem"))
    www = tmp_path / "www"
    (www / "rocm" / "core" / "tarball").mkdir(parents=True)
    for name in TARBALLS:
        (www / "rocm" / "core" / "tarball" / f"therock-dist-linux-{name}.tar.gz").write_bytes(f"rocm {name}".encode())
    for where, projects in (("pytorch", PYTORCH), ("core", CORE)):
        for project, files in projects.items():
            d = www / "rocm" / where / "whl-next" / project
            d.mkdir(parents=True)
            for f in files:
                (d / (f if f.endswith(".tar.gz") else f"{f}.whl")).write_bytes(f"wheel {f}".encode())
    with serve_folder(www, Repo, tls) as url:
        yield f"{url}/rocm"


@pytest.fixture()
def stack_copy(tmp_path):
    p = tmp_path / "mine.yaml"
    shutil.copy(STACKS_DIR / "gfx1151-rocm10.0.yaml", p)
    return p


def test_rocm_to_10_0_is_the_newest_stable_10_0_x_in_core_tarball(repo, stack_copy):
    index = f"{repo}/core/tarball/"
    changes = bump("rocm", str(stack_copy), "10.0", index_url=index)
    assert changes["rocm.version"] == "10.0.1"  # not 10.1.0, not a 7.x, not another family's
    s = load_stack(str(stack_copy))
    assert s.model.rocm.tarball.url == f"{index}therock-dist-linux-gfx1151-10.0.1.tar.gz"
    assert s.model.rocm.tarball.sha256 == hashlib.sha256(b"rocm gfx1151-10.0.1").hexdigest()
    # No --to: the newest stable of the line the stack follows is 10.1.0 (10.1.0rc1 is a pre-release).
    with pytest.raises(UserError, match="--to 10.2: .* lists 7.14.0, 7.15.0a20260728, 10.0.0, 10.0.1, 10.1.0rc1, 10.1.0"):
        bump("rocm", str(stack_copy), "10.2", index_url=index)


def test_rocm_bump_does_not_cross_rocm_lines_alone(repo, tmp_path):
    p = tmp_path / "s714.yaml"
    shutil.copy(STACKS_DIR / "gfx1151-rocm7.14.yaml", p)
    before = p.read_text()
    with pytest.raises(UserError, match="7.14.0 -> 10.0.1 changes the ROCm line; torch 2.11.0\\+rocm7.14.0"):
        bump("rocm", str(p), "10.0", index_url=f"{repo}/core/tarball/")
    assert p.read_text() == before


def test_torch_through_the_whl_next_redirect_never_takes_a_7x_wheel_tls(repo, stack_copy):
    before = stack_copy.read_text()
    changes = bump("torch", str(stack_copy), None, index_url=f"{repo}/whl-next/")
    assert changes["torch.torch"] == "2.13.0+rocm10.0.0"  # not 2.14.0+rocm7.15..., not +rocm10.1.0
    assert changes["torch.torchvision"] == "0.28.0+rocm10.0.0"
    assert changes["torch.torchaudio"] == "2.11.0.2+rocm10.0.0"  # ROCm 10.0 pairs 2.13.0 with 2.11.0.2
    # torch.wheels re-pinned, the whole coupled set, each in the whl-next/<name>/<file> form the
    # stack names (not where whl-next/ redirects), for cp313 (the stack's Python), hashed.
    s = load_stack(str(stack_copy))
    for project, files in (*PYTORCH.items(), *CORE.items()):
        file = next(f for f in files if "rocm10.0.0" in f or f.endswith("-10.0.0-py3-none-" + LINUX)
                    or f == "rocm-10.0.0.tar.gz")
        if project == "torch":
            file = "torch-2.13.0+rocm10.0.0-cp313-cp313-" + LINUX
        name = file if file.endswith(".tar.gz") else f"{file}.whl"
        want = f"{repo}/whl-next/{project}/{name.replace('+', '%2B')}#sha256=" + hashlib.sha256(
            f"wheel {file}".encode()).hexdigest()
        assert changes[f"torch.wheels.{project}"] == want and s.model.torch.wheels[project] == want, project
    assert s.model.torch.torch == "2.13.0+rocm10.0.0"
    assert all("rocm7" not in v and "/pytorch/" not in v and "/core/" not in v for v in s.model.torch.wheels.values())
    # rocm-bootstrap and setuptools are not of the set: kept as they were
    shipped = load_stack("gfx1151-rocm10.0").model.torch.wheels
    assert [s.model.torch.wheels[n] for n in ("rocm-bootstrap", "setuptools")] == [
        shipped[n] for n in ("rocm-bootstrap", "setuptools")]
    after = stack_copy.read_text()
    assert after.count("\n") == before.count("\n") and "# wheels: the cp313 Linux files" in after


NEWER = {"torch": "torch-2.13.1+rocm10.0.0-cp313-cp313-",
         "amd-torch-device-gfx1151": "amd_torch_device_gfx1151-2.13.1+rocm10.0.0-cp313-cp313-",
         "amd-torch-device-gfx115x": "amd_torch_device_gfx115x-2.13.1+rocm10.0.0-cp313-cp313-",
         "triton": "triton-3.8.1+git5a6b7c8d.rocm10.0.0-cp313-cp313-"}


@pytest.fixture()
def newer_torch(monkeypatch, request):
    """torch 2.13.1+rocm10.0.0 on the index too, with its device wheels and a newer triton of the
    line; `partial` in the test's name: without the family device wheel (gfx115x)."""
    for project, f in NEWER.items():
        if "partial" in request.node.name and project == "amd-torch-device-gfx115x":
            continue
        monkeypatch.setitem(PYTORCH, project, [*PYTORCH[project], f + LINUX])


def test_torch_bump_repins_the_whole_coupled_set_tls(newer_torch, repo, stack_copy):
    changes = bump("torch", str(stack_copy), None, index_url=f"{repo}/whl-next/")
    s = load_stack(str(stack_copy))
    assert s.model.torch.torch == "2.13.1+rocm10.0.0"
    for project, f in NEWER.items():
        name = (f + LINUX + ".whl").replace("+", "%2B")
        assert changes[f"torch.wheels.{project}"].startswith(f"{repo}/whl-next/{project}/{name}#sha256=")
        assert s.model.torch.wheels[project] == changes[f"torch.wheels.{project}"]
    # the rest of the set is of the same versions as before (torchvision 0.28.0 pairs 2.13.x): re-pinned to them
    assert "amd_torchvision_device_gfx1151-0.28.0%2Brocm10.0.0" in s.model.torch.wheels["amd-torchvision-device-gfx1151"]
    assert "/rocm-sdk-core/rocm_sdk_core-10.0.0-" in s.model.torch.wheels["rocm-sdk-core"]


def test_torch_bump_refuses_a_partial_set_in_one_line_tls(newer_torch, repo, stack_copy):
    """The index has torch 2.13.1 and its gfx1151 device wheel but not the family's (gfx115x):
    writing the rest would leave a set pip cannot install from no index. Nothing is written."""
    before = stack_copy.read_text()
    with pytest.raises(UserError) as e:
        bump("torch", str(stack_copy), None, index_url=f"{repo}/whl-next/")
    assert str(e.value) == (f"{stack_copy}: bump torch to 2.13.1+rocm10.0.0: {repo}/whl-next/ lacks "
                            "amd-torch-device-gfx115x 2.13.1+rocm10.0.0 (for cp313): the coupled set would be "
                            "partial; nothing written")
    assert stack_copy.read_text() == before
    r = subprocess.run([sys.executable, "-m", "toolbox", "bump", "torch", "--stack", str(stack_copy),
                        "--index-url", f"{repo}/whl-next/"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "lacks amd-torch-device-gfx115x" in r.stderr
    assert stack_copy.read_text() == before


def test_torch_bump_refuses_a_set_written_in_part(repo, tmp_path):
    """A stack that extends gfx1151-rocm10.0 and writes only torch's own wheel: bump torch would
    re-pin it and leave the inherited rest at the old version, so it names them and writes nothing."""
    p = tmp_path / "mine.yaml"
    torch_ref = load_stack("gfx1151-rocm10.0").model.torch.wheels["torch"]
    p.write_text(f"extends: gfx1151-rocm10.0\nname: mine\ntorch:\n  wheels:\n    torch: {torch_ref}\n")
    before = p.read_text()
    with pytest.raises(UserError, match=r"torch.wheels: bump torch re-pins the whole coupled set, and torchvision, "
                                        r"torchaudio, amd-torch-device-gfx1151, .* are not written in this file"):
        bump("torch", str(p), None, index_url=f"{repo}/whl-next/")
    assert p.read_text() == before


def test_torch_to_2_14_finds_no_rocm10_0_build(repo, stack_copy):
    # 2.14.0 exists for rocm7.15... and rocm10.1.0, neither of which is this stack's ROCm.
    with pytest.raises(UserError, match=r"--to 2.14: no torch 2.14 \+rocm10.0.0 in .*\(it lists 2.13.0\+rocm10.0.0\)"):
        bump("torch", str(stack_copy), "2.14", index_url=f"{repo}/whl-next/")


def test_cli_bump_torch_10x_is_written_tls(repo, stack_copy):
    r = subprocess.run([sys.executable, "-m", "toolbox", "bump", "torch", "--stack", str(stack_copy),
                        "--index-url", f"{repo}/whl-next/"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert 'torchaudio: "2.11.0.2+rocm10.0.0"' in stack_copy.read_text()


def test_first_use_wheel_pin_follows_the_redirect(repo, tmp_path, monkeypatch):
    """`toolbox build`'s first-use pin of a wheel (a stack without torch.wheels) reads the page
    where whl-next/ sends it and pins the file there, for the image's Python only, rocm10 only."""
    from toolbox.stack.pinning import PinsFile, pin_wheel

    monkeypatch.setenv("TOOLBOX_CACHE_DIR", str(tmp_path / "cache"))
    pins = PinsFile(tmp_path / "pins.lock.json")
    ref = pin_wheel(f"{repo}/whl-next/", "torch", "2.13.0+rocm10.0.0", "3.13", pins_file=pins, frozen=False)
    name = "torch-2.13.0+rocm10.0.0-cp313-cp313-" + LINUX
    assert ref == (f"{repo}/pytorch/whl-next/torch/{name.replace('+', '%2B')}.whl#sha256="
                   + hashlib.sha256(f"wheel {name}".encode()).hexdigest())


def _tarball(version: str, commit: str, hip: str) -> bytes:
    """A TheRock dist tarball in little: its manifest and its HIP library's file name."""
    import io
    import json
    import tarfile

    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tf:
        for name, data in {"share/therock/therock_manifest.json": json.dumps(
                               {"submodules": [{"path": "rocm-systems", "commit": commit}]}).encode(),
                           f"lib/libamdhip64.so.{hip}": b"elf"}.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def test_rocm_to_the_next_10_x_line_writes_its_own_stack_tls(repo, stack_copy, tmp_path):
    """bump rocm --to 10.1 on a 10.0 stack: a new stack beside it with 10.1's own facts (issue 38)."""
    www = tmp_path / "www" / "rocm"
    commit = "c0ffee" + "0" * 34
    data = _tarball("10.1.0", commit, "7.16.30101")
    (www / "core" / "tarball" / "therock-dist-linux-gfx1151-10.1.0.tar.gz").write_bytes(data)
    files = {}  # 10.1.0's gfx1151 set, as the shipped stack names its files
    for where, project, f in [
            ("pytorch", "torchvision", "torchvision-0.29.0a0+rocm10.1.0-cp313-cp313-" + LINUX),
            ("pytorch", "torchaudio", "torchaudio-2.11.0.3+rocm10.1.0-cp313-cp313-" + LINUX),
            ("pytorch", "amd-torch-device-gfx1151", "amd_torch_device_gfx1151-2.14.0+rocm10.1.0-cp313-cp313-" + LINUX),
            ("pytorch", "amd-torch-device-gfx115x", "amd_torch_device_gfx115x-2.14.0+rocm10.1.0-cp313-cp313-" + LINUX),
            ("pytorch", "amd-torchvision-device-gfx1151",
             "amd_torchvision_device_gfx1151-0.29.0a0+rocm10.1.0-cp313-cp313-" + LINUX),
            ("pytorch", "triton", "triton-3.8.0+git669b31ac.rocm10.1.0-cp313-cp313-" + LINUX),
            ("pytorch", "triton", "triton-3.8.0+git4cff872c.rocm10.0.0-cp313-cp313-" + LINUX),  # 10.0's: not taken
            ("core", "rocm-sdk-core", "rocm_sdk_core-10.1.0-py3-none-" + LINUX),
            ("core", "rocm-sdk-libraries", "rocm_sdk_libraries-10.1.0-py3-none-" + LINUX),
            ("core", "rocm-sdk-device-gfx1151", "rocm_sdk_device_gfx1151-10.1.0-py3-none-" + LINUX),
            ("core", "rocm", "rocm-10.0.0.tar.gz"), ("core", "rocm", "rocm-10.1.0.tar.gz")]:
        name = f if f.endswith(".tar.gz") else f"{f}.whl"
        (www / where / "whl-next" / project).mkdir(parents=True, exist_ok=True)
        (www / where / "whl-next" / project / name).write_bytes(f"file {name}".encode())
        files[name] = hashlib.sha256(f"file {name}".encode()).hexdigest()
    files["torch-2.14.0+rocm10.1.0-cp313-cp313-" + LINUX + ".whl"] = hashlib.sha256(
        b"wheel torch-2.14.0+rocm10.1.0-cp313-cp313-" + LINUX.encode()).hexdigest()
    # as 10.1.0's index has it (public install commands: torchaudio 2.11.0.3 beside torch 2.14.0)
    (www / "pytorch" / "whl-next" / "torchaudio" / f"torchaudio-2.14.0+rocm10.1.0-cp313-cp313-{LINUX}.whl").unlink()
    stack_copy.write_text(stack_copy.read_text().replace("index_url: https://stable.repo.amd.com/rocm/whl-next/",
                                                         f"index_url: {repo}/whl-next/"))
    # bitsandbytes' repository with the tag of the version 10.0 takes from PyPI
    bnb = tmp_path / "bnb"
    bnb.mkdir()
    for cmd in (["init", "-q", "-b", "main"], ["-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q",
                                               "--allow-empty", "-m", "0.50.2"], ["tag", "0.50.2"]):
        subprocess.run(["git", *cmd], cwd=bnb, check=True, capture_output=True)
    tagged = subprocess.run(["git", "rev-parse", "HEAD"], cwd=bnb, check=True, capture_output=True, text=True).stdout.strip()
    stack_copy.write_text(stack_copy.read_text().replace("  source: pypi\n  commit: null\n",
                                                         f"  source: pypi\n  repo: file://{bnb}\n  commit: null\n"))
    before = stack_copy.read_text()
    changes = bump("rocm", str(stack_copy), "10.1", index_url=f"{repo}/core/tarball/")
    assert stack_copy.read_text() == before  # the 10.0 stack stays as it is
    out = stack_copy.with_name("gfx1151-rocm10.1.yaml")  # the stack name with its line moved on
    assert changes["stack"] == str(out)
    s = load_stack(str(out))
    assert s.model.rocm.version == "10.1.0" and s.model.rocm.tarball.sha256 == hashlib.sha256(data).hexdigest()
    assert s.model.rccl.commit == commit and s.model.rocm.hip == "7.16"  # from its manifest and its libamdhip64
    assert (s.model.torch.torch, s.model.torch.torchvision, s.model.torch.torchaudio) == (
        "2.14.0+rocm10.1.0", "0.29.0a0+rocm10.1.0", "2.11.0.3+rocm10.1.0")
    # The whole set by URL, each file hashed: the shipped gfx1151-rocm10.1 in meaning (its versions
    # and URLs; the first-use fields, left unset there, filled in here from AMD's own files).
    shipped = load_stack("gfx1151-rocm10.1")
    amd = "https://stable.repo.amd.com/rocm"
    assert (s.model.rocm.version, s.model.rocm.tarball.url.replace(repo, amd)) == (shipped.model.rocm.version, shipped.model.rocm.tarball.url)
    assert (s.model.torch.torch, s.model.torch.torchvision, s.model.torch.torchaudio) == (
        shipped.model.torch.torch, shipped.model.torch.torchvision, shipped.model.torch.torchaudio)
    assert {n: r.partition("#")[0].replace(repo, amd) for n, r in s.model.torch.wheels.items()} == {
        n: r.partition("#")[0] for n, r in shipped.model.torch.wheels.items()}
    for name, ref in s.model.torch.wheels.items():
        file = urllib.parse.unquote(ref.partition("#")[0].rsplit("/", 1)[1])
        want = files.get(file) or shipped.model.torch.wheels[name].partition("#sha256=")[2]  # bootstrap, setuptools: 10.0's
        assert ref.endswith(f"#sha256={want}"), name
    assert shipped.model.rocm.tarball.sha256 is None and shipped.model.rccl.commit is None and shipped.model.rocm.hip_version is None
    from toolbox.components.bitsandbytes import rocm_library

    assert rocm_library(s) == "libbitsandbytes_rocm716.so"  # what the image build checks bitsandbytes loads
    # 10.0's PyPI wheel is for HIP 7.15: on 7.16 bitsandbytes is built from the tag of its version
    b = s.model.bitsandbytes
    assert (b.source, b.commit, b.version, changes["bitsandbytes.commit"]) == ("git", tagged, "0.50.2", tagged)
    from toolbox.rendering import render_dockerfile

    text = render_dockerfile(s)  # it renders: RCCL at that commit, torch from the index (first use)
    assert f"git-fetch.sh https://github.com/ROCm/rocm-systems {commit}" in text
    assert "torch[device-gfx1151]==2.14.0+rocm10.1.0" in text and "bnb-check.py --hip 7.16" in text
    assert f"git-fetch.sh file://{bnb} {tagged} /src/bitsandbytes" in text and "-DBNB_ROCM_ARCH=\"gfx1151\"" in text
    with pytest.raises(UserError, match="exists already"):
        bump("rocm", str(stack_copy), "10.1", index_url=f"{repo}/core/tarball/")
