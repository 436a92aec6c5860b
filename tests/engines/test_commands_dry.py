"""What build/run/create would run, checked on their exact argv (--dry-run) and the run
options a stack gets; toolbx is not installable here, and distrobox refuses root, so
their commands are checked here (the podman/Docker paths run for real elsewhere)."""

from __future__ import annotations

import os
import shlex
from pathlib import Path

import pytest

from helpers.enginekit import toolbox
from toolbox.run_options import run_spec


def argv_of(cp) -> list[str]:
    lines = [line for line in cp.stdout.splitlines() if line and not line.startswith("#")]
    assert len(lines) == 1, cp.stdout
    return shlex.split(lines[0])


@pytest.fixture
def fake_dev(tmp_path) -> Path:
    dev = tmp_path / "dev"
    for d in ("kfd", "dri", "infiniband"):
        (dev / d).mkdir(parents=True)
    return dev


def test_rocm_run_options(fake_dev, tmp_path):
    spec = run_spec(engine="podman", platform="rocm", image="img", command=["true"], workspace=tmp_path,
                    hf_cache=tmp_path / "hf", dev_root=str(fake_dev))
    assert spec.devices == [f"{fake_dev}/kfd", f"{fake_dev}/dri", f"{fake_dev}/infiniband"]
    assert len(spec.groups) == 3 and spec.security_opts == ["seccomp=unconfined"]
    assert spec.ulimits == {"memlock": "-1:-1"} and spec.ipc_host
    (fake_dev / "infiniband").rmdir()
    spec = run_spec(engine="podman", platform="rocm", image="img", command=["true"], workspace=tmp_path,
                    hf_cache=tmp_path / "hf", dev_root=str(fake_dev))
    assert f"{fake_dev}/infiniband" not in spec.devices and "memlock" not in spec.ulimits
    cpu = run_spec(engine="podman", platform="cpu", image="img", command=["true"], workspace=tmp_path, hf_cache=tmp_path / "hf")
    assert not cpu.devices and not cpu.security_opts and cpu.gpus is None
    cuda = run_spec(engine="docker", platform="cuda", image="img", command=["true"], workspace=tmp_path, hf_cache=tmp_path / "hf")
    assert cuda.gpus == "all" and not cuda.devices


def test_rootless_podman_keeps_the_callers_groups(fake_dev, tmp_path):
    from toolbox.engines import RunSpec
    from toolbox.run_options import gpu_options

    # rootless podman (and distrobox on it) cannot map host GIDs: keep-groups, never names/GIDs
    spec = RunSpec(image="img", command=[])
    gpu_options("rocm", spec, str(fake_dev), rootless=True)
    assert spec.groups == ["keep-groups"] and spec.ulimits == {"memlock": "-1:-1"}
    assert spec.device_flags().count("--group-add") == 1
    spec = RunSpec(image="img", command=[])
    gpu_options("rocm", spec, str(fake_dev), rootless=False)
    assert len(spec.groups) == 3 and "keep-groups" not in spec.groups


def test_run_dry_run_rocm_podman(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "hf_secret_value_9d2")
    cp = toolbox("run", "--stack", "gfx1151", "--engine", "podman", "--workspace", str(tmp_path), "--hf-cache",
                 str(tmp_path / "hf"), "--host-network", "--dry-run", "--", "launch", "--strategy", "ddp", "--",
                 "finetune", "--config", "train.yaml")
    assert cp.returncode == 0, cp.stderr
    assert "hf_secret_value_9d2" not in cp.stdout
    argv = argv_of(cp)
    joined = " ".join(argv)
    for piece in ("--device /dev/kfd", "--device /dev/dri", "--security-opt seccomp=unconfined", "--ipc=host",
                  "--network=host", f"-v {tmp_path}:/workspace", "-e HF_TOKEN", "-e HF_HOME=/hf-cache", "-w /workspace"):
        assert piece in joined, piece
    assert argv.count("--group-add") == 2
    # the command after the image, both `--` kept for launch
    from toolbox.run_options import default_tag
    from toolbox.stack.load import load_stack

    image = default_tag(load_stack("gfx1151"))
    assert argv[argv.index(image) + 1:] == ["launch", "--strategy", "ddp", "--", "finetune", "--config", "train.yaml"]
    if os.geteuid() == 0:
        assert "--userns=keep-id" not in argv  # root: container root is the caller already
    if not os.path.exists("/dev/kfd"):
        assert "/dev/kfd does not exist" in cp.stdout


def test_run_as_sudo_caller_owns_outputs(tmp_path, monkeypatch):
    if os.geteuid() != 0:
        pytest.skip("needs root")
    cp = toolbox("run", "--stack", "cpu", "--engine", "podman", "--workspace", str(tmp_path), "--hf-cache",
                 str(tmp_path / "hf"), "--dry-run", "--", "true", env={"SUDO_UID": "1234", "SUDO_GID": "1235"})
    argv = argv_of(cp)
    assert argv[argv.index("--user") + 1] == "1234:1235"


def test_run_refuses_env_values_on_argv(tmp_path):
    cp = toolbox("run", "--stack", "cpu", "--engine", "podman", "--workspace", str(tmp_path),
                 "--env", "WANDB_API_KEY=abc", "--dry-run", "--", "true")
    assert cp.returncode == 2 and "by name only" in cp.stderr and "abc" not in cp.stderr


def test_run_rocm_without_kfd_says_so_before_starting(tmp_path):
    if os.path.exists("/dev/kfd"):
        pytest.skip("this host has /dev/kfd")
    cp = toolbox("run", "--stack", "gfx1151", "--engine", "podman", "--workspace", str(tmp_path),
                 "--hf-cache", str(tmp_path / "hf"), "--", "true")
    if cp.returncode == 1 and "podman is not available" in cp.stderr:
        pytest.skip("podman missing")
    assert cp.returncode == 1 and "/dev/kfd does not exist" in cp.stderr and "amdgpu" in cp.stderr


def test_bad_mount(tmp_path):
    cp = toolbox("run", "--stack", "cpu", "--engine", "podman", "--mount", f"{tmp_path}/nope:/x", "--dry-run", "--", "true")
    assert cp.returncode == 2 and "does not exist" in cp.stderr
    cp = toolbox("run", "--stack", "cpu", "--engine", "podman", "--mount", f"{tmp_path}:rel", "--dry-run", "--", "true")
    assert cp.returncode == 2 and "absolute" in cp.stderr


def test_toolbx_and_distrobox_run_in_the_named_container(tmp_path):
    cp = toolbox("run", "--stack", "cpu", "--engine", "distrobox", "--name", "tb", "--workspace", str(tmp_path),
                 "--dry-run", "--", "finetune", "--config", "x.yaml")
    # distrobox-enter 1.4 re-evaluates its arguments: the argv travels base64-encoded, decoded by
    # a script free of quotes/globs/double spaces, after the image's profile (host PATH otherwise)
    argv = argv_of(cp)
    assert argv[:8] == ["distrobox", "enter", "--name", "tb", "--", "sh", "-c", argv[7]] and argv[8] == "sh"
    assert ". /etc/profile.d/toolbox-image.sh" in argv[7] and not set("'\"*?[") & set(argv[7] + argv[9])
    assert "  " not in argv[7] and len(argv) == 10
    import base64

    assert base64.b64decode(argv[9]).decode() == "exec finetune --config x.yaml"
    cp = toolbox("run", "--stack", "cpu", "--engine", "toolbx", "--name", "tb", "--workspace", str(tmp_path),
                 "--dry-run", "--", "finetune", "--config", "x.yaml", env={"TOOLBOX_TOOLBX": "/usr/bin/toolbox"})
    # toolbx passes argv exactly; the image's profile puts /opt/venv/bin before the host's PATH
    assert argv_of(cp) == ["/usr/bin/toolbox", "run", "--container", "tb", "sh", "-c",
                           'test -r /etc/profile.d/toolbox-image.sh && . /etc/profile.d/toolbox-image.sh;exec "$@"',
                           "sh", "finetune", "--config", "x.yaml"]
    cp = toolbox("run", "--stack", "cpu", "--engine", "distrobox", "--workspace", str(tmp_path), "--dry-run", "--", "true")
    assert cp.returncode == 1 and "--name" in cp.stderr


def test_create_commands():
    from toolbox.run_options import default_tag
    from toolbox.stack.load import load_stack

    image = default_tag(load_stack("gfx1151"))
    cp = toolbox("create", "--stack", "gfx1151", "--engine", "distrobox", "--name", "strix", "--dry-run")
    argv = argv_of(cp)
    assert argv[:7] == ["distrobox", "create", "--yes", "--name", "strix", "--image", image]
    flags = shlex.split(argv[argv.index("--additional-flags") + 1])
    assert flags[:4] == ["--device", "/dev/kfd", "--device", "/dev/dri"]
    assert "seccomp=unconfined" in flags and flags.count("--group-add") == 2
    cp = toolbox("create", "--stack", "gfx1151", "--engine", "toolbx", "--name", "strix", "--dry-run",
                 env={"TOOLBOX_TOOLBX": "/usr/bin/toolbox"})
    assert argv_of(cp) == ["/usr/bin/toolbox", "create", "--image", image, "strix"]  # no device flags
    cp = toolbox("create", "--stack", "cpu", "--engine", "distrobox", "--dry-run")
    assert "--additional-flags" not in cp.stdout and "toolbox-cpu" in cp.stdout


def test_distrobox_as_root_is_refused_with_a_hint():
    if os.geteuid() != 0:
        pytest.skip("needs root")
    cp = toolbox("create", "--stack", "cpu", "--engine", "distrobox")
    assert cp.returncode == 2 and "refuses to run as root" in cp.stderr


def test_build_dry_run_prints_runnable_commands(tmp_path):
    ca = tmp_path / "ca.pem"
    ca.write_text("-----BEGIN CERTIFICATE-----\nx\n-----END CERTIFICATE-----\n")
    wh = tmp_path / "wh"
    wh.mkdir()
    (wh / "torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl").write_bytes(b"not really")
    cp = toolbox("build", "--stack", "cpu", "--engine", "podman", "--ca-bundle", str(ca), "--wheelhouse", str(wh),
                 "--network", "host", "--target", "runtime", "--no-cache", "--dry-run")
    assert cp.returncode == 0, cp.stderr
    lines = cp.stdout.splitlines()
    ctx = Path(lines[0].split(": ", 1)[1])
    assert (ctx / "Dockerfile").is_file() and (ctx / "wheelhouse" / wh.iterdir().__next__().name).is_file()
    build = shlex.split(lines[2])
    assert build[:2] == ["podman", "build"] and build[-1] == str(ctx)
    for a, b in (("--secret", f"id=ca,src={ca}"), ("--network", "host"), ("--target", "runtime")):
        assert build[build.index(a) + 1] == b
    assert "--no-cache" in build and "-t" not in build  # tagged only after success
    assert build[build.index("--format") + 1] == "docker"  # SHELL (pipefail) is kept
    from toolbox.run_options import default_tag
    from toolbox.stack.load import load_stack

    assert shlex.split(lines[3]) == ["podman", "tag", '$(cat "$IIDFILE")'.replace('"', ""), default_tag(load_stack("cpu"))]
    assert lines[1] == "IIDFILE=$(mktemp)"
    import shutil

    shutil.rmtree(ctx.parent)
    cp = toolbox("build", "--stack", "cpu", "--engine", "docker", "--dry-run", env={"DOCKER_HOST": "unix:///x.sock"})
    assert "DOCKER_HOST=unix:///x.sock" in cp.stdout and "docker build" in cp.stdout


@pytest.mark.parametrize("args, message", [
    (["--ca-bundle", "/nonexistent/ca.pem"], "--ca-bundle /nonexistent/ca.pem: no such file"),
    (["--wheelhouse", "/nonexistent"], "--wheelhouse /nonexistent: not a directory"),
    (["--set", "hf.peft=latest"], "hf.peft"),
    (["--engine", "toolbx"], "invalid choice"),
])
def test_build_bad_input(args, message):
    cp = toolbox("build", "--stack", "cpu", *args, "--dry-run")
    assert cp.returncode == 2, cp.stdout + cp.stderr
    assert message in cp.stderr


def test_docker_buildkit_cli_is_found_or_the_error_says_why(tmp_path, monkeypatch):
    """The real CLIs of this machine kind: Debian's 20.10 (BuildKit built in) qualifies; a CLI of
    23+ without the buildx plugin does not, and the reason names it."""
    from toolbox.engines.docker import _cli_version, find_buildkit_cli

    monkeypatch.delenv("TOOLBOX_DOCKER_CLI", raising=False)
    old = [d for d in ("/usr/bin", "/bin") if os.path.exists(f"{d}/docker") and (_cli_version(f"{d}/docker") or (99,)) < (23,)]
    if not old:
        pytest.skip("no docker CLI older than 23 here (docker.io of Debian bookworm has one)")
    new = tmp_path / "new"
    new.mkdir()
    (new / "docker").write_text("#!/bin/sh\n[ \"$1\" = --version ] && echo 'Docker version 28.2.2, build e6534b4' && exit 0\n"
                                "echo \"docker: unknown command: docker $1\" >&2; exit 1\n")
    (new / "docker").chmod(0o755)
    monkeypatch.setenv("PATH", f"{new}:{old[0]}")
    assert find_buildkit_cli() == (f"{old[0]}/docker", "")  # the newer CLI first on PATH is passed over
    monkeypatch.setenv("PATH", str(new))
    cli, why = find_buildkit_cli()
    assert cli is None and f"{new}/docker (28.2) has no buildx plugin" in why
    monkeypatch.setenv("TOOLBOX_DOCKER_CLI", f"{old[0]}/docker")
    assert find_buildkit_cli()[0] == f"{old[0]}/docker"


@pytest.mark.parametrize("engine", ["podman", "buildkit", "docker"])
def test_a_failed_build_names_the_failing_step_not_the_last_printed(engine):
    """Stages build in parallel: the step printed last can be another stage's (CI's cpu build
    named the llama.cpp builder's apt step while pip had failed in the runtime stage)."""
    from toolbox.engines import failed_step

    log = {
        "podman": ["[4/4] STEP 4/12: RUN --mount=type=cache,target=/root/.cache/pip     pip.sh install       peft==99.0.0",
                   "ERROR: No matching distribution found for peft==99.0.0",
                   "[2/4] STEP 1/3: FROM f9a7 AS devel", "[2/4] STEP 2/3: RUN os-install.sh debian cmake",
                   'Error: building at STEP "RUN --mount=type=cache,target=/root/.cache/pip pip.sh install       '
                   'peft==99.0.0": while running runtime: exit status 1'],
        "buildkit": ["#14 [runtime 4/12] RUN pip.sh install peft==99.0.0", "#15 [devel 2/3] RUN os-install.sh cmake",
                     "#14 0.9 ERROR: No matching distribution found for peft==99.0.0", "#15 1.2 Setting up cmake",
                     '#14 ERROR: process "/bin/sh -c pip.sh install peft==99.0.0" did not complete successfully',
                     "ERROR: failed to solve: process did not complete successfully: exit code: 1"],
        "docker": ["Step 3/5 : RUN apt-get update", "Step 4/5 : RUN pip install peft==99.0.0",
                   "ERROR: No matching distribution found for peft==99.0.0"],
    }[engine]
    step = failed_step(log)
    assert step is not None and "peft==99.0.0" in step and step.split()[0] in ("[4/4]", "#14", "Step"), step


def test_build_failure_keeps_step_hint_and_last_line_within_one_shown_line():
    """The guard shows a fault as one line cut at 2000 characters: a long engine log must not push
    the hint and 'no image was tagged' out of it, and the engine's very last line stays in."""
    from toolbox.cli import one_line
    from toolbox.engines.base import build_failure

    log = [f"[2/2] STEP {i}/40: RUN pip install " + "x" * 400 for i in range(1, 40)]
    log.append("ERROR: No matching distribution found for peft==99.0.0")
    shown = one_line(build_failure("podman", log, "exit status 1"))
    assert len(shown) <= 2000 and not shown.endswith("...")
    assert "no image was tagged" in shown and "what to try" in shown
    assert shown.endswith("No matching distribution found for peft==99.0.0")
    assert "last lines:" in shown
