"""Stack options beyond the shipped defaults: ROCm from source, other targets, patches by file/URL."""

from __future__ import annotations

import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import dockerfile
import pytest

from toolbox.rendering import render_dockerfile, write_context
from toolbox.paths import PROJECT_ROOT
from toolbox.stack.load import load_stack

COMMIT = "79e85e1468f96a867108043c953e9547c13b4c5e"


def lint(tmp_path: Path, text: str) -> None:
    f = tmp_path / "Dockerfile"
    f.write_text(text)
    exe = shutil.which("hadolint") or str(Path(sys.executable).parent / "hadolint")
    r = subprocess.run([exe, "--config", str(PROJECT_ROOT / ".hadolint.yaml"), "--failure-threshold", "warning", str(f)],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stdout
    dockerfile.parse_string(text)


def user_stack(tmp_path: Path, body: str) -> Path:
    p = tmp_path / "mine.yaml"
    p.write_text(textwrap.dedent(body).lstrip())
    return p


def test_rocm_from_source(tmp_path):
    p = user_stack(tmp_path, f"""
        extends: gfx1151
        name: gfx1100-src
        gpu_targets: [gfx1100]
        rccl:
          gpu_targets: null     # follow the stack's
        rocm:
          source: source
          therock:
            repo: https://github.com/ROCm/TheRock
            commit: {COMMIT}
            components: [RCCL, HIPIFY, CORE_RUNTIME]
        torch:
          index_url: https://example.invalid/whl/gfx1100/   # gfx1151's wheels do not run on gfx1100
        """)
    s = load_stack(str(p))
    text = render_dockerfile(s)
    lint(tmp_path, text)
    assert "FROM base AS rocm-build" in text and "FROM base AS rocm-fetch" not in text
    assert "-DTHEROCK_AMDGPU_TARGETS=gfx1100" in text and "-DTHEROCK_ENABLE_ALL=OFF" in text
    # sorted, so the render does not depend on how the user ordered the list
    assert text.index("THEROCK_ENABLE_CORE_RUNTIME=ON") < text.index("THEROCK_ENABLE_HIPIFY=ON") < text.index("THEROCK_ENABLE_RCCL=ON")
    assert "COPY --from=rocm-build /opt/rocm /opt/rocm" in text
    assert '-DBNB_ROCM_ARCH="gfx1100"' in text
    assert s.pins()["rocm.therock.commit"] == COMMIT


def test_rocm_source_needs_therock_block(tmp_path):
    from toolbox.errors import UserError

    with pytest.raises(UserError, match="source: source needs a `therock:` block"):
        load_stack("gfx1151", ["rocm.source=source"])


def test_rccl_series_applied_only_when_asked(tmp_path):
    plain = render_dockerfile(load_stack("gfx1151", [f"rccl.commit={COMMIT}", "rccl.patches=null"]))
    assert "apply-patches.sh" not in plain.split("FROM devel AS bitsandbytes-build")[0]
    s = load_stack("gfx1151", [f"rccl.commit={COMMIT}", "rccl.patches=rccl-patches/gfx1151"])
    text = render_dockerfile(s)
    lint(tmp_path, text)
    assert "RUN /opt/toolbox/scripts/apply-patches.sh /src/rocm-systems --series /src/rccl-patches/gfx1151" in text
    assert len(s.pins()["rccl.patches.sha256"]) == 64
    ctx = write_context(s, tmp_path / "ctx")
    assert (ctx / "rccl-patches" / "gfx1151" / "series").is_file()
    assert (ctx / "scripts" / "rccl-abi-check.py").is_file()
    # the context's series is the one the digest was computed over
    assert load_stack("gfx1151", [f"rccl.commit={COMMIT}", f"rccl.patches={ctx / 'rccl-patches' / 'gfx1151'}"]).pins()[
        "rccl.patches.sha256"] == s.pins()["rccl.patches.sha256"]


def test_rccl_series_outside_repo_is_carried(tmp_path):
    series = tmp_path / "my-series"
    series.mkdir()
    (series / "0001-x.patch").write_text("--- a/x\n+++ b/x\n")
    (series / "series").write_text("0001-x.patch\n")  # `patches verify` needs it, so loading does
    s = load_stack("gfx1151", [f"rccl.commit={COMMIT}", f"rccl.patches={series}"])
    text = render_dockerfile(s)
    assert "--series /src/rccl-patches/_stack/my-series" in text
    ctx = write_context(s, tmp_path / "ctx")
    assert (ctx / "rccl-patches" / "_stack" / "my-series" / "0001-x.patch").is_file()


def test_unsloth_patches_by_file_and_url(tmp_path):
    (tmp_path / "fix.patch").write_text("--- a/x\n+++ b/x\n")
    sha = "c" * 64
    p = user_stack(tmp_path, f"""
        extends: gfx1151
        unsloth:
          source: git                 # patches apply to a source build (gfx1151's is PyPI's)
          version: "2026.8.19"
          commit: 015bdef0d94a241bcd94eec7a405b1700632180d
          zoo_version: "2026.8.13"
          zoo_commit: ce232d6cef9cb8cd34cd3727906131622177436b
          patches:
            - file: fix.patch
            - url: https://github.com/unslothai/unsloth/pull/4109.diff
              sha256: {sha}
        """)
    s = load_stack(str(p))
    text = render_dockerfile(s)
    lint(tmp_path, text)
    assert f"fetch-file.sh --url https://github.com/unslothai/unsloth/pull/4109.diff --sha256 {sha}" in text
    assert ("apply-patches.sh /src/unsloth /src/patches/unsloth/00-fix.patch /src/patches/unsloth/01-url.patch"
            in text)
    ctx = write_context(s, tmp_path / "ctx")
    assert (ctx / "patches" / "unsloth" / "00-fix.patch").read_text() == "--- a/x\n+++ b/x\n"


def test_unsloth_url_patch_needs_sha256(tmp_path):
    from toolbox.errors import UserError

    p = user_stack(tmp_path, """
        extends: gfx1151
        unsloth:
          source: git                 # patches apply to a source build (gfx1151's is PyPI's)
          version: "2026.8.19"
          commit: 015bdef0d94a241bcd94eec7a405b1700632180d
          zoo_version: "2026.8.13"
          zoo_commit: ce232d6cef9cb8cd34cd3727906131622177436b
          patches:
            - url: https://github.com/unslothai/unsloth/pull/4109.diff
        """)
    with pytest.raises(UserError, match=r"mine.yaml:9: unsloth.patches.0: a patch by url needs its sha256"):
        load_stack(str(p))


def test_cuda_unsloth_from_pypi(tmp_path):
    text = render_dockerfile(load_stack("cuda"))
    assert '"unsloth==2026.10.9"' in text and "unsloth_zoo==2026.10.9" in text
    # the one compiled thing in the cuda image is llama.cpp (its builder stage alone uses devel)
    assert "unsloth-build" not in text and text.count("FROM devel ") == 1 and "FROM devel AS llama_cpp-build" in text


def test_rccl_targets_follow_the_stack(tmp_path):
    from toolbox.errors import UserError

    both = ["rocm.tarball.url=https://example.invalid/therock-dist-linux-gfx1100-gfx1151-7.13.0.tar.gz",
            "torch.index_url=https://example.invalid/whl/gfx1100-gfx1151/"]  # ROCm and torch for both
    s = load_stack("gfx1151", ["rccl.gpu_targets=null", "gpu_targets=[gfx1100, gfx1151]", *both])
    assert s.rccl_targets == ["gfx1100", "gfx1151"]
    assert '-DGPU_TARGETS="gfx1100;gfx1151"' in render_dockerfile(s)
    with pytest.raises(UserError, match="rccl.gpu_targets names gfx1151, which gpu_targets does not"):
        load_stack("gfx1151", ["rccl.gpu_targets=[gfx1151]", "gpu_targets=[gfx1100]"])


def test_changing_gpu_targets_rederives_or_refuses(tmp_path):
    from toolbox.errors import UserError

    # The README's example: gfx1151's tarball and wheel index do not serve gfx1100 -> refused,
    # at the gpu_targets line, naming the fields to set.
    readme = user_stack(tmp_path, """
        extends: gfx1151
        name: mine
        gpu_targets: [gfx1100]
        """)
    with pytest.raises(UserError, match=r"mine.yaml:3: gpu_targets: rocm.tarball.url and torch.index_url are "
                                        r"for gfx1151, not gpu_targets gfx1100: set rocm.tarball.url and "
                                        r"torch.index_url for gfx1100 too"):
        load_stack(str(readme))
    with pytest.raises(UserError, match=r"--set gpu_targets=\[gfx1100\]: gpu_targets: rocm.tarball.url and"):
        load_stack("gfx1151", ["gpu_targets=[gfx1100]"])
    # With them set, everything follows: RCCL's targets (inherited, not set), bitsandbytes', the
    # tarball's sha256 (gfx1151's would be wrong: unknown again, pinned on first use).
    sha = "a" * 64
    url = "https://example.invalid/therock-dist-linux-gfx110X-all-7.13.0.tar.gz"
    s = load_stack("gfx1151", [f"rocm.tarball.sha256={sha}"])
    assert s.model.rocm.tarball.sha256 == sha and not s.model.rocm.tarball.unverified
    s = load_stack("gfx1151", [f"rocm.tarball.sha256={sha}", "gpu_targets=[gfx1100]", f"rocm.tarball.url={url}",
                               "torch.index_url=https://example.invalid/whl/gfx110X-all/"])
    assert s.rccl_targets == ["gfx1100"] and s.model.rocm.tarball.sha256 == sha  # set in the same layer: kept
    p = user_stack(tmp_path, f"""
        extends: gfx1151
        gpu_targets: [gfx1100]
        rocm:
          tarball:
            url: {url}
        torch:
          index_url: https://example.invalid/whl/gfx110X-all/
        """)
    s = load_stack(str(p), [f"rocm.tarball.sha256={sha}"])  # the --set layer sets it: kept
    assert s.model.rocm.tarball.sha256 == sha
    base_sha = tmp_path / "pinned.yaml"
    base_sha.write_text(f"extends: gfx1151\nrocm:\n  tarball:\n    sha256: {sha}\n")
    p.write_text(p.read_text().replace("extends: gfx1151", f"extends: {base_sha}"))
    s = load_stack(str(p))  # the parent's sha256 was for the parent's URL: dropped
    assert s.model.rocm.tarball.sha256 is None and s.model.rocm.tarball.unverified and "rocm.tarball" in s.unverified_pins()
    text = render_dockerfile(s)
    assert text.count('-DGPU_TARGETS="gfx1100"') == 3 and '-DBNB_ROCM_ARCH="gfx1100"' in text  # +llama.cpp
    assert f"--url {url}" in text and "dist tarball for gfx1100" in text
    # an explicit rccl.gpu_targets is kept, and must still be a subset
    with pytest.raises(UserError, match="rccl.gpu_targets names gfx1151, which gpu_targets does not"):
        load_stack(str(p), ["rccl.gpu_targets=[gfx1151]"])


def test_unsloth_patches_need_a_source_build(tmp_path):
    from toolbox.errors import UserError

    (tmp_path / "fix.patch").write_text("--- a/x\n+++ b/x\n")
    p = user_stack(tmp_path, """
        extends: gfx1151
        unsloth:
          patches:
            - file: fix.patch
        """)
    with pytest.raises(UserError, match=r"unsloth: patches apply to a source: git build"):
        load_stack(str(p))


def test_rocm_unsloth_from_pypi_locked(tmp_path):
    """gfx1151's PyPI Unsloth (issue 24): in the hash-checked lock, less what the ROCm image takes
    elsewhere (triton: the ROCm torch's; xformers: CUDA-only; bitsandbytes: built from git)."""
    from toolbox.stack import python_lock

    s = load_stack("gfx1151")
    text = render_dockerfile(s)
    assert "unsloth-build" not in text and "unsloth[" not in text
    lock = python_lock.current(s).read_text()
    for name in ("triton", "xformers", "bitsandbytes"):
        assert f"# left out: {name}, which PyPI Unsloth requires" in lock
        assert f"\n{name}==" not in lock
    assert "\nunsloth==2026.10.9 \\" in lock and "\nunsloth-zoo==2026.10.9 \\" in lock and "\ntrl==1.15.0 \\" in lock
    runtime = text[text.index("FROM base AS runtime"):]
    step = runtime[runtime.index("# unsloth 2026.10.9 from PyPI"):runtime.index("# llama.cpp")]
    assert "pip.sh install" not in step and 'assert "+rocm" in v' in step
    assert "pip.sh check --missing-ok xformers \\" in text
    # the 7.14 stack installs PyPI's bitsandbytes (in its lock): only triton and xformers are left out
    lock714 = python_lock.current(load_stack("gfx1151-rocm7.14")).read_text()
    assert "# left out: bitsandbytes" not in lock714 and "\nbitsandbytes==0.50.1 \\" in lock714
    # cuda takes everything from PyPI: nothing left out, pip check unconditional
    cuda = render_dockerfile(load_stack("cuda"))
    assert "pip.sh check \\" in cuda and "--missing-ok" not in cuda and "left out" not in cuda


def test_rocm_unsloth_from_pypi_unlocked(tmp_path):
    """A pin set without a lock: the wheels --no-deps, then their requirements less the left-out ones."""
    s = load_stack("gfx1151", ["hf.peft=0.21.1"])
    text = render_dockerfile(s)
    lint(tmp_path, text)
    assert '/opt/toolbox/scripts/pip.sh install --no-deps "unsloth==2026.10.9" unsloth_zoo==2026.10.9 \\' in text
    assert "requires.py --leave-out bitsandbytes,triton,xformers unsloth unsloth_zoo" in text
    ctx = write_context(s, tmp_path / "ctx")
    assert (ctx / "scripts" / "requires.py").is_file()
    assert not (write_context(load_stack("cuda"), tmp_path / "cuda") / "scripts" / "requires.py").exists()
