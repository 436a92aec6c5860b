"""`toolbox patches verify` against a real local git repository the test builds.

A good series (two patches made with git format-patch) applies; a series whose second
patch was made against a different tree fails at that patch, names it, and skips the
rest; the user's clone (HEAD, index, work tree, refs) is left exactly as it was.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from toolbox.errors import UserError
from toolbox.rccl.patches import parse_series, patch_paths, verify

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="needs git")

ENV = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.invalid",
       "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@example.invalid", "GIT_CONFIG_NOSYSTEM": "1"}


def git(cwd: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=cwd, env=ENV, check=True, capture_output=True, text=True).stdout.strip()


def toolbox(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "toolbox", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)


CMAKE = """set(DEFAULT_GPUS
      gfx1100
      gfx1102
      gfx1200)
"""
TUNING = """int index(const char* arch) {
  // {"gfx1100", 0}, {"gfx1102", 0}
  return 0;
}
"""


@pytest.fixture()
def upstream(tmp_path):
    """A fake upstream: base commit, a later commit, and a series written against the base."""
    repo = tmp_path / "upstream"
    (repo / "projects/rccl/src/graph").mkdir(parents=True)
    git(tmp_path, "init", "-q", "-b", "develop", str(repo))
    (repo / "projects/rccl/CMakeLists.txt").write_text(CMAKE)
    (repo / "projects/rccl/src/graph/tuning.cc").write_text(TUNING)
    (repo / "projects/other").mkdir()
    (repo / "projects/other/big.bin").write_bytes(b"\0" * 1024)
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "base")
    base = git(repo, "rev-parse", "HEAD")

    # Write the patches on a side branch, export them, then drop the branch.
    git(repo, "checkout", "-q", "-b", "work")
    cm = repo / "projects/rccl/CMakeLists.txt"
    cm.write_text(CMAKE.replace("gfx1102\n", "gfx1102\n      gfx1151\n"))
    git(repo, "commit", "-q", "-am", "rccl: build gfx1151 by default")
    tu = repo / "projects/rccl/src/graph/tuning.cc"
    tu.write_text(TUNING.replace('{"gfx1102", 0}', '{"gfx1102", 0}, {"gfx1151", 0}'))
    git(repo, "commit", "-q", "-am", "rccl: tuning entry for gfx1151")
    good = tmp_path / "good"
    git(repo, "format-patch", "-q", "-o", str(good), base)
    git(repo, "checkout", "-q", "develop")
    git(repo, "branch", "-q", "-D", "work")

    # Upstream moves on: the tuning line changes, so the second patch no longer applies there.
    tu.write_text(TUNING.replace("return 0;", "return arch ? 0 : -1;").replace('{"gfx1100", 0}', '{"gfx1100", 3}'))
    git(repo, "commit", "-q", "-am", "upstream: retune gfx1100")
    later = git(repo, "rev-parse", "HEAD")

    names = sorted(p.name for p in good.glob("*.patch"))
    (good / "series").write_text(
        "# test series\n# upstream: https://example.invalid/rocm-systems\n"
        f"# base-commit: {base}\n\n" + "\n".join(names) + "\n")
    return {"repo": repo, "base": base, "later": later, "series": good / "series", "names": names}


def _snapshot(repo: Path) -> tuple:
    return (git(repo, "rev-parse", "HEAD"), git(repo, "status", "--porcelain", "--ignored"),
            git(repo, "for-each-ref"), git(repo, "worktree", "list", "--porcelain"),
            git(repo, "symbolic-ref", "HEAD"))


def test_good_series_applies_on_its_base_and_leaves_the_clone_untouched(upstream):
    repo = upstream["repo"]
    (repo / "local-edit.txt").write_text("user's uncommitted work\n")
    before = _snapshot(repo)
    r = toolbox("patches", "verify", "--source", str(repo), "--series", str(upstream["series"]))
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"commit   {upstream['base']}  base" in r.stdout
    for name in upstream["names"]:
        assert f"[ok  ] {name}" in r.stdout
    assert "result   OK: 2/2 applied" in r.stdout
    assert _snapshot(repo) == before
    assert (repo / "local-edit.txt").read_text() == "user's uncommitted work\n"
    assert "gfx1151" not in (repo / "projects/rccl/CMakeLists.txt").read_text()


def test_patched_tree_is_the_expected_one(upstream, tmp_path):
    keep = tmp_path / "kept"
    report = verify(upstream["repo"], parse_series(upstream["series"]), keep=keep)
    assert report.ok
    assert "gfx1151" in (keep / "projects/rccl/CMakeLists.txt").read_text()
    assert '{"gfx1151", 0}' in (keep / "projects/rccl/src/graph/tuning.cc").read_text()
    # Sparse: only the directories the patches touch were checked out.
    assert not (keep / "projects/other/big.bin").exists()
    log = git(keep, "log", "--format=%s", f"{upstream['base']}..HEAD")
    assert log.splitlines() == ["rccl: tuning entry for gfx1151", "rccl: build gfx1151 by default"]


def test_series_that_does_not_apply_fails_at_the_right_patch(upstream):
    r = toolbox("patches", "verify", "--source", str(upstream["repo"]), "--series", str(upstream["series"]),
                "--commit", upstream["later"])
    assert r.returncode == 1, r.stdout + r.stderr
    first, second = upstream["names"]
    assert f"[ok  ] {first}" in r.stdout
    assert f"[FAIL] {second}" in r.stdout
    assert "git apply --check failed" in r.stdout and "tuning.cc" in r.stdout
    assert "result   FAILED: 1/2 applied" in r.stdout
    assert "verified against --commit instead" in r.stdout


def test_later_patches_are_skipped_after_a_failure(upstream):
    series = upstream["series"]
    first, second = upstream["names"]
    series.write_text(series.read_text().replace(f"{first}\n{second}\n", f"{second}\n{first}\n"))
    report = verify(upstream["repo"], parse_series(series), upstream["later"])
    assert [r.status for r in report.results] == ["failed", "skipped"]
    assert not report.ok


def test_bad_input_is_exit_2_with_file_and_line(upstream, tmp_path):
    series = upstream["series"]
    r = toolbox("patches", "verify", "--source", str(tmp_path / "nope"), "--series", str(series))
    assert r.returncode == 2 and "not a directory" in r.stderr
    plain = tmp_path / "plain"
    plain.mkdir()
    r = toolbox("patches", "verify", "--source", str(plain), "--series", str(series))
    assert r.returncode == 2 and "not a git repository" in r.stderr
    r = toolbox("patches", "verify", "--source", str(upstream["repo"]), "--series", str(series),
                "--commit", "0123456789abcdef0123456789abcdef01234567")
    assert r.returncode == 2 and "is not in" in r.stderr and "fetch it first" in r.stderr

    broken = series.parent / "broken-series"
    broken.write_text("# base-commit: xyz\n")
    with pytest.raises(UserError, match=r"broken-series:1: base-commit 'xyz'"):
        parse_series(broken)
    broken.write_text("0001-a.patch\n9999-missing.patch\n")
    with pytest.raises(UserError, match=r"broken-series:1: patch file .*0001-a.patch does not exist"):
        parse_series(broken)
    broken.write_text(f"{upstream['names'][0]}\n{upstream['names'][0]}\n")
    with pytest.raises(UserError, match=r"broken-series:2: .* listed twice \(first on line 1\)"):
        parse_series(broken)
    broken.write_text(f"{upstream['names'][0]} -p0\n")
    with pytest.raises(UserError, match=r"broken-series:1: unsupported options '-p0'"):
        parse_series(broken)
    broken.write_text("../escape.patch\n")
    with pytest.raises(UserError, match=r"broken-series:1: .* must be a path inside"):
        parse_series(broken)
    broken.write_text("# nothing\n")
    with pytest.raises(UserError, match="lists no patches"):
        parse_series(broken)


def test_shipped_series_are_well_formed_and_agree_with_their_stacks():
    from toolbox.stack.load import load_stack

    for name in ("gfx1151", "gfx1151-early2026"):
        stack = load_stack(name)
        series = parse_series(stack.rccl_patch_dir / "series")
        assert series.upstream == "https://github.com/ROCm/rocm-systems"
        assert series.base_commit == stack.model.rccl.commit, name
        assert series.subdir == stack.model.rccl.subdir == "projects/rccl"
        for patch in series.patches:
            text = patch.read_text()
            assert text.startswith("From 0000000000000000000000000000000000000000"), patch  # git format-patch
            assert "Reference:" in text, f"{patch.name}: the message must cite its public reference"
            assert all(p.startswith("projects/rccl/") for p in patch_paths(patch))
        # git format-patch --base records the base commit in the series.
        assert any(f"base-commit: {series.base_commit}" in p.read_text() for p in series.patches)


def test_stack_and_series_must_agree_on_the_commit(upstream, tmp_path):
    mine = tmp_path / "mine.yaml"
    mine.write_text("extends: gfx1151\nname: mine\nrccl:\n  commit: " + "ab" * 20 + "\n")
    r = toolbox("patches", "verify", "--source", str(upstream["repo"]), "--stack", str(mine))
    assert r.returncode == 2, r.stdout + r.stderr
    assert "stack pins rccl.commit " + "ab" * 20 in r.stderr and "make them agree" in r.stderr



def _preimage_tree(patch: Path, root: Path) -> None:
    """A git tree holding only the lines each hunk of `patch` expects, at their line numbers
    (fillers elsewhere): enough for `git apply` to check the hunks' counts, offsets and
    context agree with each other, without the upstream source."""
    import re

    files: dict[str, dict[int, str]] = {}
    rows = None
    lines = patch.read_text().splitlines()
    i = 0
    while i < len(lines):
        m = re.match(r"^diff --git a/(\S+) b/", lines[i])
        h = re.match(r"^@@ -(\d+)(?:,(\d+))? \+\d+(?:,\d+)? @@", lines[i])
        i += 1
        if m:
            rows = files.setdefault(m.group(1), {})
        elif h and rows is not None:
            start, count, k = int(h.group(1)), int(h.group(2) or 1), 0
            while k < count:
                line = lines[i]
                i += 1
                if line[:1] in (" ", "-", ""):
                    rows[start + k] = line[1:]
                    k += 1
    for path, rows in files.items():
        f = root / path
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text("".join(rows.get(n, f"/* filler {n} */") + "\n" for n in range(1, max(rows) + 20)))


@pytest.mark.parametrize("stack", ["gfx1151", "gfx1151-early2026"])
def test_every_shipped_patch_is_consistent_with_its_own_hunks(stack, tmp_path):
    # Catches a hand-edited patch whose hunk headers or context no longer add up; the
    # upstream check is `toolbox patches verify` on a rocm-systems clone (rccl-patches/README.md).
    for n, patch in enumerate(parse_series(ROOT / "rccl-patches" / stack / "series").patches):
        tree = tmp_path / f"t{n}"
        tree.mkdir()
        git(tmp_path, "init", "-q", str(tree))
        _preimage_tree(patch, tree)
        git(tree, "add", "-A")
        git(tree, "commit", "-q", "-m", "pre-image")
        r = subprocess.run(["git", "apply", "--check", str(patch)], cwd=tree, env=ENV, capture_output=True, text=True)
        assert r.returncode == 0, f"{patch.name}: {r.stderr}"


def test_gfx1151_series_fixes_the_stream_change_deadlock():
    """ROCm 7.13's RCCL needs the #5800 fix that TheRock's therock-7.13 applies at build time:
    both launch paths record doneEvent on the launch stream, and only then mark it valid."""
    patches = parse_series(ROOT / "rccl-patches/gfx1151/series").patches
    fix = [p for p in patches if "projects/rccl/src/enqueue.cc" in patch_paths(p)]
    assert len(fix) == 1, [p.name for p in patches]
    added = [ln[1:].strip() for ln in fix[0].read_text().splitlines() if ln.startswith("+") and not ln.startswith("+++")]
    records = [i for i, ln in enumerate(added) if ln.startswith("CUDACHECKGOTO(hipEventRecord(comm->doneEvent, launchStream)")]
    valid = [i for i, ln in enumerate(added) if ln == "comm->lastStreamValid = true;"]
    assert len(records) == len(valid) == 2, added
    assert all(r < v for r, v in zip(records, valid))
    assert any("comm->lastStreamValid && comm->lastStream != launchStream" in ln for ln in added)
    assert "bool lastStreamValid;" in added and "comm->lastStreamValid = false;" in added
