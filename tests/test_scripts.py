"""The install steps' shell scripts, run for real against archives and git repos that the tests
make, served from a local HTTP server on 127.0.0.1: wrong sha256, wrong layout, a patch that does
not apply and a floating ref each fail."""

from __future__ import annotations

import functools
import hashlib
import http.server
import io
import os
import subprocess
import sys
import tarfile
import threading
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).resolve().parents[1] / "dockerfiles" / "scripts"
LAYOUT = ["bin/hipcc", "bin/rocminfo", "lib/libamdhip64.so", "share/therock/therock_manifest.json"]


def sh(*args, env=None, cwd=None):
    full = dict(os.environ, **(env or {}))
    return subprocess.run([str(a) for a in args], capture_output=True, text=True, env=full, cwd=cwd, timeout=60)


@pytest.fixture()
def served(tmp_path):
    root = tmp_path / "www"
    root.mkdir()
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(root))
    handler.log_message = lambda *a, **k: None
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    t = threading.Thread(target=server.serve_forever, daemon=True)
    t.start()
    yield root, f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def make_tarball(path: Path, members: list[str], prefix: str = "") -> str:
    with tarfile.open(path, "w:gz") as tar:
        for name in members:
            data = f"content of {name}\n".encode()
            info = tarfile.TarInfo(prefix + name)
            info.size = len(data)
            info.mtime = 0
            tar.addfile(info, io.BytesIO(data))
    return hashlib.sha256(path.read_bytes()).hexdigest()


def fetch_archive(url, sha, dest, *extra):
    args = [SCRIPTS / "fetch-archive.sh", "--url", url, "--sha256", sha, "--dest", dest, *extra]
    for p in LAYOUT:
        args += ["--expect", p]
    return sh(*args)


def test_fetch_archive_ok(served, tmp_path):
    root, base = served
    sha = make_tarball(root / "therock.tar.gz", LAYOUT + ["lib/librccl.so.1"])
    dest = tmp_path / "rocm"
    r = fetch_archive(f"{base}/therock.tar.gz", sha, dest)
    assert r.returncode == 0, r.stderr
    assert (dest / "bin" / "hipcc").read_text() == "content of bin/hipcc\n"


def test_fetch_archive_strip(served, tmp_path):
    root, base = served
    sha = make_tarball(root / "t.tar.gz", LAYOUT, prefix="therock-7/")
    r = fetch_archive(f"{base}/t.tar.gz", sha, tmp_path / "rocm", "--strip", "1")
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "rocm" / "lib" / "libamdhip64.so").is_file()


def test_fetch_archive_wrong_sha256(served, tmp_path):
    root, base = served
    make_tarball(root / "t.tar.gz", LAYOUT)
    dest = tmp_path / "rocm"
    r = fetch_archive(f"{base}/t.tar.gz", "0" * 64, dest)
    assert r.returncode == 1
    assert "sha256 mismatch" in r.stderr
    assert not dest.exists()


def test_fetch_archive_wrong_layout(served, tmp_path):
    root, base = served
    # A real mistake: the tarball nests everything one level down.
    sha = make_tarball(root / "t.tar.gz", LAYOUT, prefix="install/")
    dest = tmp_path / "rocm"
    r = fetch_archive(f"{base}/t.tar.gz", sha, dest)
    assert r.returncode == 1
    assert "wrong layout" in r.stderr and "bin/hipcc" in r.stderr
    assert not dest.exists()


def test_fetch_file_bad_sha_form_and_404(served, tmp_path):
    root, base = served
    (root / "f").write_text("x")
    r = sh(SCRIPTS / "fetch-file.sh", "--url", f"{base}/f", "--sha256", "abc", "--out", tmp_path / "o")
    assert r.returncode == 2 and "64 hex" in r.stderr
    r = sh(SCRIPTS / "fetch-file.sh", "--url", f"{base}/missing", "--sha256", "0" * 64, "--out", tmp_path / "o")
    assert r.returncode != 0 and not (tmp_path / "o").exists()


def test_fetch_file_unverified_prints_hash(served, tmp_path):
    root, base = served
    (root / "f").write_text("hello")
    r = sh(SCRIPTS / "fetch-file.sh", "--url", f"{base}/f", "--sha256", "UNVERIFIED", "--out", tmp_path / "o")
    assert r.returncode == 0
    assert hashlib.sha256(b"hello").hexdigest() in r.stderr and "WARNING" in r.stderr


def git(*args, cwd):
    r = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True,
                       env=dict(os.environ, GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@t", GIT_COMMITTER_NAME="t",
                                GIT_COMMITTER_EMAIL="t@t", GIT_AUTHOR_DATE="2026-01-01T00:00:00Z",
                                GIT_COMMITTER_DATE="2026-01-01T00:00:00Z"))
    assert r.returncode == 0, r.stderr
    return r.stdout.strip()


@pytest.fixture()
def upstream(tmp_path):
    repo = tmp_path / "upstream"
    repo.mkdir()
    git("init", "-q", "-b", "main", cwd=repo)
    (repo / "src.c").write_text("int arch(void) { return 1100; }\n")
    git("add", "src.c", cwd=repo)
    git("commit", "-q", "-m", "one", cwd=repo)
    first = git("rev-parse", "HEAD", cwd=repo)
    (repo / "src.c").write_text("int arch(void) { return 1101; }\n")
    git("commit", "-q", "-am", "two", cwd=repo)
    return repo, first, git("rev-parse", "HEAD", cwd=repo)


def test_git_fetch_exact_commit(upstream, tmp_path):
    repo, first, _ = upstream
    out = tmp_path / "co"
    r = sh(SCRIPTS / "git-fetch.sh", f"file://{repo}", first, out)
    assert r.returncode == 0, r.stderr
    assert git("rev-parse", "HEAD", cwd=out) == first
    assert "1100" in (out / "src.c").read_text()


@pytest.mark.parametrize("ref", ["main", "latest", "HEAD", "abc123"])
def test_git_fetch_refuses_floating_ref(upstream, tmp_path, ref):
    repo, _, _ = upstream
    r = sh(SCRIPTS / "git-fetch.sh", f"file://{repo}", ref, tmp_path / "co")
    assert r.returncode == 2 and "not a 40-hex commit" in r.stderr


def test_git_fetch_unknown_commit_fails(upstream, tmp_path):
    repo, _, _ = upstream
    r = sh(SCRIPTS / "git-fetch.sh", f"file://{repo}", "e" * 40, tmp_path / "co")
    assert r.returncode != 0


def make_patch(repo: Path, old: str, new: str) -> str:
    (repo / "src.c").write_text(new)
    diff = git("diff", cwd=repo) + "\n"
    (repo / "src.c").write_text(old)
    return diff


def test_apply_patches_series(upstream, tmp_path):
    repo, first, _ = upstream
    tree = tmp_path / "co"
    assert sh(SCRIPTS / "git-fetch.sh", f"file://{repo}", first, tree).returncode == 0
    series = tmp_path / "series-dir"
    series.mkdir()
    # Made one on top of the other in a scratch clone, as a real series is.
    scratch = tmp_path / "scratch"
    assert sh(SCRIPTS / "git-fetch.sh", f"file://{repo}", first, scratch).returncode == 0
    (scratch / "src.c").write_text("int arch(void) { return 1151; }\n")
    (series / "0001-gfx1151.patch").write_text(git("diff", cwd=scratch) + "\n")
    git("commit", "-q", "-am", "p1", cwd=scratch)
    (scratch / "src.c").write_text("int arch(void) { return 1151; }\n/* gfx1151 */\n")
    (series / "0002-comment.patch").write_text(git("diff", cwd=scratch) + "\n")
    # The series file's order is the order of application: 0002 needs 0001 first.
    (series / "series").write_text("# RCCL gfx1151\n0001-gfx1151.patch\n0002-comment.patch\n")
    r = sh(SCRIPTS / "apply-patches.sh", tree, "--series", series)
    assert r.returncode == 0, r.stderr
    assert (tree / "src.c").read_text() == "int arch(void) { return 1151; }\n/* gfx1151 */\n"
    assert "2 patch(es) applied" in r.stdout


def test_apply_patch_that_does_not_apply_fails(upstream, tmp_path):
    repo, _, second = upstream
    tree = tmp_path / "co"
    assert sh(SCRIPTS / "git-fetch.sh", f"file://{repo}", second, tree).returncode == 0
    # Made against the first commit's text, so it cannot apply to the second.
    bad = tmp_path / "stale.patch"
    bad.write_text(make_patch(tree, "int arch(void) { return 1101; }\n", "int arch(void) { return 1151; }\n")
                   .replace("return 1101", "return 1100"))
    r = sh(SCRIPTS / "apply-patches.sh", tree, bad)
    assert r.returncode == 1
    assert "stale.patch does not apply" in r.stderr
    assert (tree / "src.c").read_text() == "int arch(void) { return 1101; }\n"


def test_apply_patches_missing_file(upstream, tmp_path):
    repo, first, _ = upstream
    tree = tmp_path / "co"
    assert sh(SCRIPTS / "git-fetch.sh", f"file://{repo}", first, tree).returncode == 0
    series = tmp_path / "s"
    series.mkdir()
    (series / "series").write_text("0001-gone.patch\n")
    r = sh(SCRIPTS / "apply-patches.sh", tree, "--series", series)
    assert r.returncode == 1 and "missing patch file" in r.stderr


def test_pip_check_passes_and_fails(tmp_path):
    freeze = tmp_path / "freeze.txt"
    env = {"TOOLBOX_PYTHON": sys.executable, "TOOLBOX_FREEZE": str(freeze)}
    r = sh(SCRIPTS / "pip.sh", "check", env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "pydantic==" in freeze.read_text()
    site = tmp_path / "site"
    meta = site / "brokenpkg-1.0.dist-info"
    meta.mkdir(parents=True)
    (meta / "METADATA").write_text("Metadata-Version: 2.1\nName: brokenpkg\nVersion: 1.0\n"
                                   "Requires-Dist: no-such-package-zzz\n")
    r = sh(SCRIPTS / "pip.sh", "check", env=dict(env, PYTHONPATH=str(site)))
    assert r.returncode == 1
    assert "no-such-package-zzz" in r.stdout


def fake_dist(site: Path, name: str, version: str, *requires: str) -> None:
    meta = site / f"{name}-{version}.dist-info"
    meta.mkdir(parents=True)
    (meta / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
                                   + "".join(f"Requires-Dist: {r}\n" for r in requires))


def test_pip_check_missing_ok_allows_only_the_names_given(tmp_path):
    """ROCm images: PyPI Unsloth requires xformers, which nothing provides there (issue 24)."""
    env = {"TOOLBOX_PYTHON": sys.executable, "TOOLBOX_FREEZE": str(tmp_path / "freeze.txt")}
    site = tmp_path / "site"
    fake_dist(site, "unslothfake", "2026.10.9", 'xformers>=0.0.27.post2; "linux" in sys_platform')
    env["PYTHONPATH"] = str(site)
    r = sh(SCRIPTS / "pip.sh", "check", env=env)
    assert r.returncode == 1 and "requires xformers, which is not installed." in r.stdout
    r = sh(SCRIPTS / "pip.sh", "check", "--missing-ok", "xformers", env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "allowed (--missing-ok): unslothfake 2026.10.9 requires xformers" in r.stdout
    assert (tmp_path / "freeze.txt").is_file()
    # another missing package, or xformers at a wrong version, still fails
    fake_dist(site, "other", "1.0", "no-such-package-zzz")
    r = sh(SCRIPTS / "pip.sh", "check", "--missing-ok", "xformers", env=env)
    assert r.returncode == 1 and "no-such-package-zzz" in r.stdout
    site2 = tmp_path / "site2"
    fake_dist(site2, "unslothfake", "2026.10.9", "xformers>=9")
    fake_dist(site2, "xformers", "0.0.1")
    r = sh(SCRIPTS / "pip.sh", "check", "--missing-ok", "xformers", env=dict(env, PYTHONPATH=str(site2)))
    assert r.returncode == 1 and "xformers 0.0.1" in r.stdout


def test_requires_lists_requirements_less_the_left_out(tmp_path):
    site = tmp_path / "site"
    fake_dist(site, "unsloth", "2026.10.9", "unsloth_zoo>=2026.10.9", "torch<2.15.0,>=2.4.0",
              'triton>=3.0.0; "linux" in sys_platform', "xformers>=0.0.27.post2", "bitsandbytes>=0.45.5",
              'triton-windows; sys_platform == "win32"', 'boto3>=1.34.0; extra == "s3"', "trl<=1.15.0,>=0.18.2")
    fake_dist(site, "unsloth_zoo", "2026.10.9", "torchao>=0.13.0", "trl<=1.15.0,>=0.18.2", "Triton>=3.0.0")
    env = {"PYTHONPATH": str(site)}
    r = sh(sys.executable, SCRIPTS / "requires.py", "--leave-out", "bitsandbytes,triton,xformers", "unsloth",
           "unsloth_zoo", env=env)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines == ["torch<2.15.0,>=2.4.0", "trl<=1.15.0,>=0.18.2", "torchao>=0.13.0"], lines
    r = sh(sys.executable, SCRIPTS / "requires.py", "not-installed-zzz", env=env)
    assert r.returncode == 1 and "not-installed-zzz is not installed" in r.stderr


def test_pip_sh_skips_torch_index_when_wheelhouse_has_torch(tmp_path):
    """pip.sh's argument assembly, seen through a stand-in interpreter that prints its argv."""
    fake = tmp_path / "py"
    fake.write_text("#!/bin/sh\nprintf '%s\\n' \"$@\"\n")
    fake.chmod(0o755)
    wh = tmp_path / "wh"
    wh.mkdir()
    env = {"TOOLBOX_PYTHON": str(fake), "TOOLBOX_WHEELHOUSE": str(wh)}
    r = sh(SCRIPTS / "pip.sh", "install", "--torch-index", "https://example.invalid/cpu", "torch==2.13.0+cpu", env=env)
    assert "--extra-index-url\nhttps://example.invalid/cpu" in r.stdout and "--find-links" not in r.stdout
    (wh / "torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl").write_bytes(b"")
    r = sh(SCRIPTS / "pip.sh", "install", "--torch-index", "https://example.invalid/cpu", "torch==2.13.0+cpu", env=env)
    assert f"--find-links\n{wh}" in r.stdout and "extra-index-url" not in r.stdout


def test_scripts_pass_shell_syntax_check():
    for f in sorted(SCRIPTS.glob("*.sh")):
        assert sh("sh", "-n", f).returncode == 0, f
        assert os.access(f, os.X_OK), f"{f} must be executable"
