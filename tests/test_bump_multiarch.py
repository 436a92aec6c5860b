"""`toolbox bump rocm|torch` on TheRock's multi-arch layout (ROCm 7.14 on), against a local HTTP
server (127.0.0.1) serving a fake tarball-multi-arch/ folder and a whl-multi-arch/ pip index.

The server is Python's own static file server: its directory listings are the index pages, as
AMD's are listings of a file tree, and '+' in wheel names arrives URL-quoted as it does there.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from helpers.httpd import serve_folder
from toolbox.stack.bumping import bump
from toolbox.errors import ToolError, UserError
from toolbox.paths import STACKS_DIR
from toolbox.stack.load import load_stack

ROOT = Path(__file__).resolve().parents[1]
TARBALLS = ["gfx1151-7.13.0", "gfx1151-7.14.0", "gfx1151-7.14.1", "gfx1151-7.15.0", "gfx1151-7.16.0a20260901",
            "gfx110X-all-7.99.0", "multiarch-7.99.0"]
MANYLINUX = "manylinux_2_28_x86_64"
WHEELS = {
    "torch": ["torch-2.11.0+rocm7.14.0-cp312-cp312-" + MANYLINUX, "torch-2.12.0+rocm7.14.0-cp312-cp312-" + MANYLINUX,
              "torch-2.12.1+rocm7.14.0-cp311-cp311-" + MANYLINUX,  # another Python: not for this stack
              "torch-2.13.0+rocm7.14.0-cp312-cp312-win_amd64",  # Windows only
              "torch-2.13.0+rocm7.15.0-cp312-cp312-" + MANYLINUX],  # another ROCm
    "torchvision": ["torchvision-0.26.0+rocm7.14.0-cp312-cp312-" + MANYLINUX,
                    "torchvision-0.27.0+rocm7.14.0-cp312-cp312-" + MANYLINUX],
    "torchaudio": ["torchaudio-2.11.0+rocm7.14.0-cp312-cp312-" + MANYLINUX,
                   "torchaudio-2.12.0+rocm7.14.0-cp312-cp312-" + MANYLINUX],
    # The GPU code of torch[device-gfx1151]: published for 2.11.0 only.
    "amd-torch-device-gfx1151": ["amd_torch_device_gfx1151-2.11.0+rocm7.14.0-py3-none-" + MANYLINUX],
}


@pytest.fixture()
def repo(tmp_path):
    root = tmp_path / "www" / "rocm"
    (root / "tarball-multi-arch").mkdir(parents=True)
    for name in TARBALLS:
        (root / "tarball-multi-arch" / f"therock-dist-linux-{name}.tar.gz").write_bytes(f"rocm {name}".encode())
    for project, files in WHEELS.items():
        (root / "whl-multi-arch" / project).mkdir(parents=True)
        for f in files:
            (root / "whl-multi-arch" / project / f"{f}.whl").write_bytes(b"PK")
    with serve_folder(tmp_path / "www") as url:
        yield f"{url}/rocm"


@pytest.fixture()
def stack_copy(tmp_path):
    p = tmp_path / "mine.yaml"
    shutil.copy(STACKS_DIR / "gfx1151-rocm7.14.yaml", p)
    return p


def test_rocm_newest_stable_and_series(repo, stack_copy):
    index = f"{repo}/tarball-multi-arch/"
    # No --to: the newest stable (7.16.0a is a pre-release; other families and multiarch ignored).
    changes = bump("rocm", str(stack_copy), None, index_url=index)
    assert changes["rocm.version"] == "7.15.0"
    # --to 7.14: the newest stable 7.14.x, for a stack that follows one release series.
    changes = bump("rocm", str(stack_copy), "7.14", index_url=index)
    assert changes["rocm.version"] == "7.14.1"
    s = load_stack(str(stack_copy))
    assert s.model.rocm.tarball.url == f"{index}therock-dist-linux-gfx1151-7.14.1.tar.gz"
    assert s.model.rocm.tarball.sha256 == hashlib.sha256(b"rocm gfx1151-7.14.1").hexdigest()
    assert "rocm.tarball" not in s.unverified_pins()
    with pytest.raises(UserError, match="--to 7.17: .* lists 7.13.0, 7.14.0, 7.14.1, 7.15.0, 7.16.0a20260901"):
        bump("rocm", str(stack_copy), "7.17", index_url=index)


def test_torch_multi_arch_needs_the_device_package(repo, stack_copy):
    index = f"{repo}/whl-multi-arch/"
    before = stack_copy.read_text()
    # The newest torch for ROCm 7.14.0 and cp312 is 2.12.0, but its gfx1151 device package is missing.
    with pytest.raises(ToolError, match="torch 2.12.0\\+rocm7.14.0 has no amd-torch-device-gfx1151"):
        bump("torch", str(stack_copy), None, index_url=index)
    assert stack_copy.read_text() == before  # nothing written
    changes = bump("torch", str(stack_copy), "2.11", index_url=index)
    assert changes == {"torch.torch": "2.11.0+rocm7.14.0", "torch.torchvision": "0.26.0+rocm7.14.0",
                       "torch.torchaudio": "2.11.0+rocm7.14.0", "torch.unverified": False}
    s = load_stack(str(stack_copy))
    assert not s.model.torch.unverified and s.model.torch.multi_arch
    assert "torch" not in s.unverified_pins()
    after = stack_copy.read_text()
    assert after.count("\n") == before.count("\n") and "# The multi-arch index" in after


def test_torch_pairs_vision_and_audio_with_torch(repo, tmp_path):
    # Without the device-package requirement (a per-arch index), 2.12.0 pairs with 0.27.0.
    p = tmp_path / "perarch.yaml"
    p.write_text((STACKS_DIR / "gfx1151-rocm7.14.yaml").read_text().replace("multi_arch: true", "multi_arch: false"))
    changes = bump("torch", str(p), None, index_url=f"{repo}/whl-multi-arch/")
    assert changes["torch.torch"] == "2.12.0+rocm7.14.0"
    assert changes["torch.torchvision"] == "0.27.0+rocm7.14.0"
    assert changes["torch.torchaudio"] == "2.12.0+rocm7.14.0"
    with pytest.raises(UserError, match="--to 2.9: no torch 2.9"):
        bump("torch", str(p), "2.9", index_url=f"{repo}/whl-multi-arch/")


def test_cli_bump_torch_unreachable_index_is_one_line(stack_copy):
    r = subprocess.run([sys.executable, "-m", "toolbox", "bump", "torch", "--stack", str(stack_copy),
                        "--index-url", "http://127.0.0.1:9/"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and "Traceback" not in r.stderr
    assert "cannot reach http://127.0.0.1:9/torch/" in r.stderr
