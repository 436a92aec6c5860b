"""`toolbox bump` against a local HTTP server (tarball index, registry v2 API) and local git repos."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from helpers.httpd import Quiet, serve_folder
from toolbox.stack.bumping import bump
from toolbox.errors import UserError
from toolbox.paths import STACKS_DIR
from toolbox.stack.load import load_stack

ROOT = Path(__file__).resolve().parents[1]
DIGEST = "sha256:" + "ab" * 32


class Handler(Quiet):
    def do_HEAD(self):
        if self.path == "/v2/fedora/manifests/43":
            self.send_response(200)
            self.send_header("Docker-Content-Digest", DIGEST)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        super().do_HEAD()


@pytest.fixture()
def server(tmp_path):
    root = tmp_path / "www"
    (root / "tarball").mkdir(parents=True)
    with serve_folder(root, Handler) as url:
        yield root, url


@pytest.fixture()
def stack_copy(tmp_path):
    """A standalone copy of the gfx1151 stack that bump may rewrite."""
    p = tmp_path / "gfx1151-mine.yaml"
    shutil.copy(STACKS_DIR / "gfx1151.yaml", p)
    return p


def test_bump_rocm_newest_tarball(server, stack_copy):
    root, base = server
    for v in ("7.12.0", "7.13.0", "7.9.0"):
        (root / "tarball" / f"therock-dist-linux-gfx1151-{v}.tar.gz").write_bytes(f"rocm {v}".encode())
    (root / "tarball" / "therock-dist-linux-gfx1100-7.99.0.tar.gz").write_bytes(b"other target")
    before = stack_copy.read_text()
    changes = bump("rocm", str(stack_copy), None, index_url=f"{base}/tarball/")
    want = hashlib.sha256(b"rocm 7.13.0").hexdigest()
    assert changes["rocm.version"] == "7.13.0"  # version order, not string order (7.9 < 7.13)
    assert changes["rocm.tarball.sha256"] == want
    s = load_stack(str(stack_copy))
    assert s.model.rocm.tarball.sha256 == want and not s.model.rocm.tarball.unverified
    assert s.model.rocm.tarball.url == f"{base}/tarball/therock-dist-linux-gfx1151-7.13.0.tar.gz"
    assert "rocm.tarball" not in s.unverified_pins()
    after = stack_copy.read_text()
    # Comments survive; only the pinned lines change.
    assert after.count("\n") == before.count("\n")
    assert "# ROCm 7.13.0: AMD's install docs" in after


def test_bump_rocm_to_exact_version_and_unknown(server, stack_copy):
    root, base = server
    for v in ("7.12.0", "7.13.0"):
        (root / "tarball" / f"therock-dist-linux-gfx1151-{v}.tar.gz").write_bytes(v.encode())
    assert bump("rocm", str(stack_copy), "7.12.0", index_url=f"{base}/tarball/")["rocm.version"] == "7.12.0"
    before = stack_copy.read_text()
    with pytest.raises(UserError, match="no tarball for gfx1151 at that version"):
        bump("rocm", str(stack_copy), "7.99.0", index_url=f"{base}/tarball/")
    assert stack_copy.read_text() == before


def test_bump_base_digest(server, stack_copy):
    _, base = server
    changes = bump("base", str(stack_copy), None, registry_url=base)
    assert changes["base.digest"] == DIGEST
    s = load_stack(str(stack_copy))
    assert s.base_image == f"registry.fedoraproject.org/fedora:43@{DIGEST}"
    assert "base" not in s.unverified_pins()


def git(*args, cwd):
    env = dict(os.environ, GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@t", GIT_COMMITTER_NAME="t", GIT_COMMITTER_EMAIL="t@t")
    r = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stderr
    return r.stdout.strip()


def test_bump_git_ref_to_commit(tmp_path, stack_copy):
    repo = tmp_path / "bnb"
    repo.mkdir()
    git("init", "-q", "-b", "main", cwd=repo)
    git("commit", "-q", "--allow-empty", "-m", "release", cwd=repo)
    tagged = git("rev-parse", "HEAD", cwd=repo)
    git("tag", "-a", "0.51.0", "-m", "0.51.0", cwd=repo)
    git("commit", "-q", "--allow-empty", "-m", "next", cwd=repo)
    head = git("rev-parse", "HEAD", cwd=repo)
    text = stack_copy.read_text().replace("https://github.com/bitsandbytes-foundation/bitsandbytes", f"file://{repo}")
    stack_copy.write_text(text)
    assert bump("bitsandbytes", str(stack_copy), "0.51.0")["bitsandbytes.commit"] == tagged
    b = load_stack(str(stack_copy)).model.bitsandbytes
    assert (b.commit, b.version) == (tagged, "0.51.0")  # a release tag: the wheel built from it is 0.51.0
    assert bump("bitsandbytes", str(stack_copy), "latest")["bitsandbytes.commit"] == head
    assert load_stack(str(stack_copy)).model.bitsandbytes.version == "0.51.0"  # a branch says no version
    with pytest.raises(UserError, match="no such ref"):
        bump("bitsandbytes", str(stack_copy), "no-such-branch")


def test_bump_unsloth_from_pypi_has_no_commit(stack_copy):
    """gfx1151's Unsloth comes from PyPI (issue 24): no commit to bump, the file stays as it was."""
    before = stack_copy.read_text()
    for component in ("unsloth", "unsloth_zoo"):
        with pytest.raises(UserError, match=r"unsloth: source is pypi, not git: no commit to bump"):
            bump(component, str(stack_copy), "main")
    assert stack_copy.read_text() == before


def test_bump_cli_unknown_component_exit_2(stack_copy):
    r = subprocess.run([sys.executable, "-m", "toolbox", "bump", "rocmm", "--stack", str(stack_copy)],
                       cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 2


def test_bump_unreachable_is_tool_error(stack_copy):
    before = stack_copy.read_text()
    r = subprocess.run([sys.executable, "-m", "toolbox", "bump", "rocm", "--stack", str(stack_copy),
                        "--index-url", "http://127.0.0.1:9/"], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 1 and "cannot reach" in r.stderr
    assert stack_copy.read_text() == before
