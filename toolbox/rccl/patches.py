"""Prove that a patch series applies to its pinned upstream commit.

A series is a quilt-style file: one patch file name per line (relative to the series
file), `#` comments, and two header comments this project relies on:

    # upstream: https://github.com/ROCm/rocm-systems
    # base-commit: <40-hex sha>

`verify()` never touches the user's clone: it makes a throw-away clone that borrows
its objects (`git clone --shared`, so nothing is copied and nothing is written back),
checks out the pinned commit (sparse: only the directories the patches touch), then
for each patch runs `git apply --check` followed by `git am`, and reports per patch.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from toolbox.errors import ToolError, UserError

_HEADER = re.compile(r"^#\s*(upstream|base-commit|subdir)\s*:\s*(\S+)\s*$")
_SHA = re.compile(r"^[0-9a-f]{7,40}$")
_DIFF_PATH = re.compile(r"^diff --git a/(\S+) b/(\S+)$", re.M)

# Deterministic identity and no user/system config: the result must not depend on who runs it.
_GIT_ENV = {
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_AUTHOR_NAME": "toolbox patches verify",
    "GIT_AUTHOR_EMAIL": "verify@toolbox.invalid",
    "GIT_COMMITTER_NAME": "toolbox patches verify",
    "GIT_COMMITTER_EMAIL": "verify@toolbox.invalid",
    "GIT_TERMINAL_PROMPT": "0",
    "LC_ALL": "C",
}


@dataclass
class Series:
    path: Path
    patches: list[Path]
    upstream: str | None = None
    base_commit: str | None = None
    subdir: str | None = None
    names: list[str] = field(default_factory=list)  # as written in the series file

    def digest(self) -> str:
        """sha256 over each patch's name and bytes, in order (the lock's rccl.patches.sha256)."""
        h = hashlib.sha256()
        for name, patch in zip(self.names, self.patches):
            h.update(name.encode() + b"\0" + patch.read_bytes() + b"\0")
        return h.hexdigest()


class MissingPatch(UserError):
    """A series names a patch file that is not there."""

    def __init__(self, series: Path, line: int, name: str):
        super().__init__(f"{series}:{line}: patch file {(series.parent / name).resolve()} does not exist")
        self.series, self.line, self.name = series, line, name


@dataclass
class PatchResult:
    patch: Path
    subject: str
    status: str  # "ok" | "failed" | "skipped"
    files: int = 0
    added: int = 0
    removed: int = 0
    step: str = ""  # which step failed: "apply --check" or "am"
    detail: str = ""


@dataclass
class Report:
    series: Series
    source: Path
    commit: str
    commit_subject: str
    results: list[PatchResult] = field(default_factory=list)
    final_tree: str = ""

    @property
    def ok(self) -> bool:
        return bool(self.results) and all(r.status == "ok" for r in self.results)


def parse_series(path: Path) -> Series:
    """Read a series file; UserError names the file and line of anything wrong."""
    path = Path(path)
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        raise UserError(f"{path}: series file not found") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise UserError(f"{path}: cannot read series file: {exc}") from None
    series = Series(path=path, patches=[])
    seen: dict[str, int] = {}
    for no, raw in enumerate(lines, 1):
        line = raw.strip()
        if not line:
            continue
        if line.startswith("#"):
            m = _HEADER.match(line)
            if m:
                key, value = m.group(1), m.group(2)
                if key == "base-commit":
                    if not _SHA.match(value):
                        raise UserError(f"{path}:{no}: base-commit {value!r} is not a hex commit id")
                    series.base_commit = value
                elif key == "upstream":
                    series.upstream = value
                else:
                    series.subdir = value.strip("/")
            continue
        parts = line.split()
        name = parts[0]
        # quilt allows "-pN" after the name; git am applies -p1 patches only.
        if len(parts) > 2 or (len(parts) == 2 and parts[1] != "-p1"):
            raise UserError(f"{path}:{no}: unsupported options {' '.join(parts[1:])!r} "
                            "(only '-p1' patches made by git format-patch are supported)")
        if os.path.isabs(name) or ".." in Path(name).parts:
            raise UserError(f"{path}:{no}: patch {name!r} must be a path inside {path.parent}")
        if name in seen:
            raise UserError(f"{path}:{no}: patch {name!r} is listed twice (first on line {seen[name]})")
        seen[name] = no
        patch = (path.parent / name).resolve()
        if not patch.is_file():
            raise MissingPatch(path, no, name)
        series.patches.append(patch)
        series.names.append(name)
    if not series.patches:
        raise UserError(f"{path}: the series lists no patches")
    return series


def patch_subject(patch: Path) -> str:
    text = patch.read_text(encoding="utf-8", errors="replace")
    m = re.search(r"^Subject: (?:\[[^\]]*\] )?(.*(?:\n [^\n]*)*)", text, re.M)
    return " ".join(m.group(1).split()) if m else patch.name


def patch_paths(patch: Path) -> list[str]:
    text = patch.read_text(encoding="utf-8", errors="replace")
    return sorted({p for pair in _DIFF_PATH.findall(text) for p in pair})


def _git(args: list[str], cwd: Path | None = None, check: bool = False) -> subprocess.CompletedProcess:
    env = {**os.environ, **_GIT_ENV}
    try:
        res = subprocess.run(["git", *args], cwd=cwd, env=env, capture_output=True, text=True)
    except FileNotFoundError:
        raise ToolError("git is not installed") from None
    if check and res.returncode != 0:
        raise ToolError(f"git {' '.join(args)} failed: {_clean(res.stderr) or res.stdout.strip()}")
    return res


def _clean(stderr: str) -> str:
    # rocm-systems' .gitmodules makes every git command warn about duplicate entries.
    keep = [ln for ln in stderr.splitlines() if ln.strip() and "multiple configurations found" not in ln]
    return "\n".join(keep).strip()


def _sparse_dirs(paths: list[str]) -> list[str]:
    dirs = set()
    for p in paths:
        parent = Path(p).parent.parts[:2]  # projects/rccl, src, ... (cone mode takes directories)
        if parent:
            dirs.add("/".join(parent))
    return sorted(dirs)


def verify(source: Path, series: Series, commit: str | None = None, keep: Path | None = None) -> Report:
    source = Path(source).expanduser().resolve()
    if keep is not None and Path(keep).exists():
        raise UserError(f"--keep {keep}: already exists")
    if not source.is_dir():
        raise UserError(f"--source {source}: not a directory")
    probe = _git(["-C", str(source), "rev-parse", "--git-dir"])
    if probe.returncode != 0:
        raise UserError(f"--source {source}: not a git repository")
    partial = _git(["-C", str(source), "config", "--get", "extensions.partialClone"]).stdout.strip()
    if partial:
        # The throw-away clone borrows DIR's objects but cannot fetch the blobs a partial clone lacks.
        raise UserError(f"--source {source}: a partial clone (filter via remote {partial!r}); "
                        "use a full clone: git clone https://github.com/ROCm/rocm-systems")
    commit = commit or series.base_commit
    if not commit:
        raise UserError(f"{series.path}: no '# base-commit: SHA' line, and no --commit given")
    resolved = _git(["-C", str(source), "rev-parse", "--verify", "--quiet", f"{commit}^{{commit}}"])
    if resolved.returncode != 0:
        raise UserError(f"commit {commit} is not in {source}; fetch it first "
                        f"(git -C {source} fetch origin {commit})")
    sha = resolved.stdout.strip()
    subject = _git(["-C", str(source), "log", "-1", "--format=%s", sha]).stdout.strip()
    report = Report(series=series, source=source, commit=sha, commit_subject=subject)

    tmp = Path(tempfile.mkdtemp(prefix="toolbox-patches-"))
    wt = tmp / "tree"
    try:
        _git(["clone", "--quiet", "--shared", "--no-checkout", str(source), str(wt)], check=True)
        all_paths = [p for patch in series.patches for p in patch_paths(patch)]
        dirs = _sparse_dirs(all_paths)
        if dirs:
            _git(["sparse-checkout", "set", "--cone", *dirs], cwd=wt, check=True)
        _git(["-c", "advice.detachedHead=false", "checkout", "--quiet", "--detach", sha], cwd=wt, check=True)
        # reset --hard primes the index's cache-tree, so `git am` rewrites only the trees the
        # patches touch and never re-reads blobs outside them (absent in a partial clone).
        _git(["reset", "--quiet", "--hard", sha], cwd=wt, check=True)
        failed = False
        for patch in series.patches:
            res = PatchResult(patch=patch, subject=patch_subject(patch), status="skipped")
            report.results.append(res)
            if failed:
                res.detail = "not tried: an earlier patch failed"
                continue
            stat = _git(["apply", "--numstat", str(patch)], cwd=wt)
            for line in stat.stdout.splitlines():
                a, r, _ = line.split("\t", 2)
                res.files += 1
                res.added += int(a) if a.isdigit() else 0
                res.removed += int(r) if r.isdigit() else 0
            check = _git(["apply", "--check", str(patch)], cwd=wt)
            if check.returncode != 0:
                res.status, res.step, res.detail = "failed", "git apply --check", _clean(check.stderr)
                failed = True
                continue
            am = _git(["am", "--quiet", "--keep-cr", str(patch)], cwd=wt)
            if am.returncode != 0:
                res.status, res.step, res.detail = "failed", "git am", _clean(am.stderr) or am.stdout.strip()
                _git(["am", "--abort"], cwd=wt)
                failed = True
                continue
            res.status = "ok"
        report.final_tree = _git(["rev-parse", "HEAD^{tree}"], cwd=wt).stdout.strip()
        if keep is not None:
            shutil.move(str(wt), str(keep))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return report


def format_report(report: Report) -> str:
    s = report.series
    out = [f"series   {s.path}  ({len(s.patches)} patches)",
           f"upstream {s.upstream or '(not recorded)'}",
           f"source   {report.source}",
           f"commit   {report.commit}  {report.commit_subject}"]
    if s.base_commit and not report.commit.startswith(s.base_commit):
        out.append(f"note     the series records base-commit {s.base_commit}; verified against --commit instead")
    width = max(len(r.patch.name) for r in report.results) if report.results else 0
    for r in report.results:
        mark = {"ok": "ok  ", "failed": "FAIL", "skipped": "skip"}[r.status]
        stat = f"{r.files} file(s) +{r.added} -{r.removed}"
        out.append(f"  [{mark}] {r.patch.name:<{width}}  {stat:<20} {r.subject}")
        if r.status == "failed":
            out.append(f"         {r.step} failed:")
            out.extend(f"           {ln}" for ln in (r.detail or "(no output)").splitlines()[:12])
        elif r.status == "skipped":
            out.append(f"         {r.detail}")
    n_ok = sum(r.status == "ok" for r in report.results)
    verdict = "OK" if report.ok else "FAILED"
    out.append(f"result   {verdict}: {n_ok}/{len(report.results)} applied with git apply --check + git am"
               + (f"; patched tree {report.final_tree}" if report.ok else ""))
    return "\n".join(out)
