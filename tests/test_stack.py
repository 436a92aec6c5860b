"""Stack loading: shipped stacks, extends, --set, and every bad-input case (file, field path, line)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from toolbox.errors import UserError
from toolbox.stack.load import load_stack, stack_names

ROOT = Path(__file__).resolve().parents[1]
GOOD_COMMIT = "37d2a9387f7146ccb85517ff45c665d345bfda79"


def write(tmp_path: Path, text: str, name: str = "mine.yaml") -> Path:
    p = tmp_path / name
    p.write_text(textwrap.dedent(text).lstrip(), encoding="utf-8")
    return p


def err(ref, overrides=()) -> str:
    with pytest.raises(UserError) as exc:
        load_stack(str(ref), overrides)
    return str(exc.value)


def test_shipped_stacks_load():
    assert {"gfx1151", "gfx1151-rocm10.0", "cpu", "cuda"} <= set(stack_names())
    g = load_stack()  # the default: ROCm 10.1.0 (docs/stacks.md, "The default")
    assert g.model.name == "gfx1151-rocm10.1" and g.model.platform == "rocm" and g.model.gpu_targets == ["gfx1151"]
    assert g.model.rocm.version == "10.1.0" and g.model.torch.torch == "2.14.0+rocm10.1.0"
    assert g.base_image == "registry.fedoraproject.org/fedora:43"
    c = load_stack("cpu")
    assert c.model.platform == "cpu" and c.model.gpu_targets == [] and c.base_image == "docker.io/library/debian:bookworm-slim"
    assert load_stack("cuda").model.platform == "cuda"


def test_lock_and_digest():
    s = load_stack("cpu")
    lock = s.pins()
    assert lock["torch.version"] == "2.13.0+cpu"
    assert lock["transformers.version"] == "5.17.0"
    assert list(lock) == sorted(lock)
    d = s.digest()
    assert len(d) == 12 and int(d, 16) >= 0
    assert load_stack("cpu", ["hf.trl=1.14.0"]).digest() != d
    assert load_stack("cpu").digest() == d


def test_unverified_pins_listed():
    assert load_stack("cpu").unverified_pins() == []
    u = load_stack("gfx1151").unverified_pins()
    assert "rocm.tarball" in u and "base" in u


def test_extends_changes_only_a_few_pins(tmp_path):
    p = write(tmp_path, """
        extends: cpu
        name: mine
        hf:
          trl: "1.14.0"
        """)
    s = load_stack(str(p))
    assert s.model.name == "mine" and s.model.hf.trl == "1.14.0" and s.model.hf.transformers == "5.17.0"
    assert s.base_image == "docker.io/library/debian:bookworm-slim"


def test_set_override_and_string_versions():
    s = load_stack("cpu", ["hf.trl=1.10", "base.digest=sha256:" + "a" * 64])
    assert s.model.hf.trl == "1.10"
    assert s.base_image.endswith("@sha256:" + "a" * 64)


def test_unknown_key_names_file_path_and_line(tmp_path):
    p = write(tmp_path, """
        extends: gfx1151
        rocm:
          verison: "7.13.0"
        """)
    msg = err(p)
    assert f"{p}:3: rocm.verison: unknown key" in msg


def test_unknown_key_via_set():
    msg = err("gfx1151", ["rocm.verison=7.1"])
    assert "--set rocm.verison=7.1" in msg and "rocm.verison" in msg and "unknown key" in msg


@pytest.mark.parametrize("value", ["main", "latest", "abc123", "v0.50.1", GOOD_COMMIT.upper()])
def test_non_40_hex_commit(tmp_path, value):
    p = write(tmp_path, f"""
        extends: gfx1151
        bitsandbytes:
          commit: {value}
        """)
    msg = err(p)
    assert f"{p}:3: bitsandbytes.commit: must be a full 40-hex commit" in msg


@pytest.mark.parametrize("value", ["latest", ">=5.0", "5.*", "main", "~=5.1"])
def test_floating_version_refused(tmp_path, value):
    p = write(tmp_path, f"""
        extends: cpu
        hf:
          transformers: "{value}"
        """)
    assert f"{p}:3: hf.transformers: must be an exact version" in err(p)


def test_latest_image_tag_refused(tmp_path):
    p = write(tmp_path, """
        extends: cpu
        base:
          image: docker.io/library/debian:latest
        """)
    assert f"{p}:3: base.image: tag 'latest' floats" in err(p)


def test_bad_sha256_form(tmp_path):
    p = write(tmp_path, """
        extends: gfx1151
        rocm:
          tarball:
            sha256: "deadbeef"
        """)
    assert f"{p}:4: rocm.tarball.sha256: must be 64 lowercase hex" in err(p)


def test_missing_sha256_needs_unverified(tmp_path):
    p = write(tmp_path, """
        extends: gfx1151
        rocm:
          tarball:
            unverified: false
        """)
    assert "rocm.tarball: sha256 is required" in err(p)


def test_unknown_gpu_target(tmp_path):
    p = write(tmp_path, """
        extends: gfx1151
        gpu_targets: [gfx1115]
        """)
    assert f"{p}:2: gpu_targets: unknown GPU target 'gfx1115'" in err(p)


def test_missing_patch_file(tmp_path):
    series = tmp_path / "series-dir"
    series.mkdir()
    (series / "series").write_text("0001-present.patch\n0002-absent.patch\n")
    (series / "0001-present.patch").write_text("")
    p = write(tmp_path, f"""
        extends: gfx1151
        rccl:
          patches: {series}
        """)
    msg = err(p)
    assert f"{p}:3: rccl.patches: missing patch file '0002-absent.patch'" in msg


def test_missing_patch_dir_and_unsloth_patch_file(tmp_path):
    p = write(tmp_path, """
        extends: gfx1151
        rccl:
          patches: no-such-dir
        """)
    assert "rccl.patches: no patch series directory 'no-such-dir'" in err(p)
    q = write(tmp_path, """
        extends: gfx1151
        unsloth:
          source: git
          commit: 015bdef0d94a241bcd94eec7a405b1700632180d
          zoo_commit: ce232d6cef9cb8cd34cd3727906131622177436b
          patches:
            - file: gone.patch
        """, "q.yaml")
    assert f"{q}:7: unsloth.patches.0.file: missing patch file 'gone.patch'" in err(q)


def test_malformed_yaml(tmp_path):
    p = write(tmp_path, "name: x\nbase: [unclosed\nplatform: cpu\n")
    msg = err(p)
    assert msg.startswith(f"{p}:") and "malformed YAML" in msg


def test_not_a_mapping_and_missing_file(tmp_path):
    p = write(tmp_path, "- a\n- b\n")
    assert f"{p}:1: a stack file must be a YAML mapping" in err(p)
    assert "no stack" in err(tmp_path / "nope.yaml")


def test_platform_rules(tmp_path):
    p = write(tmp_path, """
        extends: cpu
        gpu_targets: [gfx1151]
        """)
    assert "gpu_targets only belongs to platform rocm" in err(p)


def test_cli_bad_input_exit_2_and_no_output_file(tmp_path):
    p = write(tmp_path, """
        extends: gfx1151
        rocm:
          verison: "1"
        """)
    out = tmp_path / "Dockerfile"
    r = subprocess.run([sys.executable, "-m", "toolbox", "render", "--stack", str(p), "--output", str(out)],
                       cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 2
    assert f"{p}:3: rocm.verison: unknown key" in r.stderr
    assert not out.exists() and list(tmp_path.iterdir()) == [p]
    ctx = tmp_path / "ctx"
    r = subprocess.run([sys.executable, "-m", "toolbox", "context", "--stack", "cpu", "--set", "hf.trl=latest",
                        "--output", str(ctx)], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 2 and "hf.trl" in r.stderr and not ctx.exists()


def test_a_series_patches_verify_refuses_does_not_load(tmp_path):
    """The stack reads rccl.patches with the parser `toolbox patches verify` uses (one parser)."""
    from toolbox.errors import UserError
    from toolbox.rccl.patches import parse_series

    series = tmp_path / "s"
    series.mkdir()
    (series / "0001-a.patch").write_text("")
    p = write(tmp_path, f"""
        extends: gfx1151
        rccl:
          patches: {series}
        """)
    for text, problem in (("0001-a.patch\n0001-a.patch\n", "listed twice"),
                          ("0001-a.patch -p0\n", "unsupported options '-p0'"),
                          ("../0001-a.patch\n", "must be a path inside"),
                          ("# only comments\n", "lists no patches")):
        (series / "series").write_text(text)
        with pytest.raises(UserError, match=problem):
            parse_series(series / "series")
        assert f"{p}:3: rccl.patches: " in err(p) and problem in err(p)
    (series / "series").unlink()
    assert f"{p}:3: rccl.patches: " in err(p) and "series file not found" in err(p)


def test_one_trl_for_every_stack():
    """The preference objectives are written against one TRL, and every shipped stack pins it
    (issue 24: the gfx1151 stacks moved to the cuda stack's Unsloth 2026.10.9 and TRL 1.15.0)."""
    from toolbox_train.planning.inputs import TRL_FOR_OBJECTIVES

    pins = {name: load_stack(name).model.hf.trl for name in stack_names()}
    assert set(pins.values()) == {TRL_FOR_OBJECTIVES}, pins
