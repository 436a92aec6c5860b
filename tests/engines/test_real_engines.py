"""Issue 15, for real on the cpu image (built once per session, shared): a real dockerd
(BuildKit build, CA secret absent from history and save, 2 DDP ranks), and distrobox and
toolbx as an unprivileged user on rootless podman (create, an argv with shell metacharacters
passed intact, a tiny training run, doctor). No rebuild outside the Docker build itself: the
users' engines get the podman-built image by `podman save | podman load`."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from helpers.enginekit import ROOT, TestUser, ca_bundle, need, toolbox, wheelhouse

pytestmark = pytest.mark.slow

MARK = "TOOLBOX-TEST-CA-MARK-6c1e0b"
# argv that a shell would re-parse wrongly: parentheses, quotes, runs of spaces, a newline, globs
NASTY = ["echo 'x(y)'", "a  b\tc\nd", "*", "$HOME", '"q"', "\\", "", "; rm -rf ~", "(", "it's"]
PROBE = "import json, sys; print('ARGV=' + json.dumps(sys.argv[1:]) + ' PREFIX=' + sys.prefix)"


def _marked_ca_bundle(tmp_path: Path) -> Path:
    """The host's CA bundle (pip needs it here) plus a comment line to look for afterwards:
    the image's own ca-certificates file may equal the host's, a marker cannot."""
    f = tmp_path / "ca-marked.pem"
    f.write_text(ca_bundle().read_text() + f"\n# {MARK}\n")
    return f


def _train_workspace(ws: Path, tiny_model: Path, **overrides) -> Path:
    from helpers.tiny import write_dataset, write_train_config

    shutil.copytree(tiny_model, ws / "model")
    write_dataset(ws / "data" / "train.jsonl", "text", n=32)
    cfg = {"method": "lora", "train.max_steps": 6, "train.learning_rate": 1e-2, **overrides}
    return write_train_config(ws / "train.yaml", ws / "model", ws / "data" / "train.jsonl", ws / "out", **cfg)


def _assert_loss_went_down(out: Path) -> list[dict]:
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]
    losses = [r["loss"] for r in rows if "loss" in r]
    assert len(losses) >= 3 and losses[-1] < losses[0], losses
    return rows


def _probe_argv(stdout: str) -> tuple[list[str], str]:
    m = re.search(r"^ARGV=(.*) PREFIX=(\S+)$", stdout, re.M)
    assert m, stdout[-3000:]
    return json.loads(m.group(1)), m.group(2)


# -- Docker: a real daemon, BuildKit through a CLI that has it --------------------------------
def test_docker_daemon_buildkit_build_ddp_run_and_doctor(dockerd, tiny_model, tmp_path):
    from test_cpu_stack import assert_trained, train_argv

    env = {"DOCKER_HOST": dockerd.url}
    ca = _marked_ca_bundle(tmp_path)
    tag = "localhost/toolbox-cpu:dockerd"
    # this dockerd has no bridge (the host's network stays untouched): RUN steps use the host's
    cp = toolbox("build", "--stack", "cpu", "--engine", "docker", "--tag", tag, "--network", "host",
                 "--ca-bundle", str(ca), "--wheelhouse", str(wheelhouse()), env=env, timeout=1800)
    out = cp.stdout + cp.stderr
    assert cp.returncode == 0, out[-6000:]
    assert re.search(r"^#\d+ \[base 1/\d+\] FROM docker.io/library/debian:bookworm-slim", cp.stdout, re.M), \
        "not a BuildKit build"
    assert "docker/dockerfile" not in out  # the built-in frontend: nothing pulled
    assert f"image:  {tag}" in cp.stdout
    labels = json.loads(dockerd.run("image", "inspect", "--format", "{{json .Config.Labels}}", tag, text=True).stdout)
    assert labels["io.github.toolbox.stack"] == "cpu"

    # the CA bundle was a build secret: neither its path nor its text in the history or any layer
    hist = dockerd.run("history", "--no-trunc", "--format", "{{.CreatedBy}}", tag, text=True).stdout
    assert "RUN" in hist and str(ca) not in hist and MARK not in hist
    save = subprocess.Popen(dockerd.cli("save", tag), stdout=subprocess.PIPE)
    tail, size = b"", 0
    for chunk in iter(lambda: save.stdout.read(1 << 20), b""):
        assert MARK.encode() not in tail + chunk
        tail, size = chunk[-64:], size + len(chunk)
    assert save.wait() == 0 and size > 100 << 20

    # 2 DDP ranks (gloo) through the Docker SDK against this daemon
    from test_cpu_stack import workspace

    ws = workspace(tmp_path, tiny_model, **{"train.max_steps": 6})
    cp = toolbox("run", "--engine", "docker", "--image", tag, "--network", "host", "--workspace", str(ws),
                 "--hf-cache", str(tmp_path / "hf"), *train_argv(), env=env, timeout=900)
    assert cp.returncode == 0, cp.stdout[-5000:] + cp.stderr[-5000:]
    assert_trained(ws, tiny_model)

    cp = toolbox("doctor", "--engine", "docker", "--image", tag, "--stack", "cpu", "--network", "host",
                 "--in-image", env=env, timeout=600)
    assert cp.returncode == 0, cp.stdout + cp.stderr
    assert "] engine: docker" in cp.stdout
    assert "label pins: all" in cp.stdout and "pin transformers.version: transformers 5.17.0" in cp.stdout


# -- distrobox and toolbx: an unprivileged user's rootless podman ------------------------------
def _container_engine_round(user: TestUser, via: str, tag: str, tiny_model: Path) -> None:
    name = f"toolbox-ci-{via}"
    target = ["--image", tag, "--platform", "cpu", "--name", name]
    from toolbox.engines.toolbx import find_toolbx

    # a leftover of a run that was cut short
    user.run(["distrobox", "rm", "--force", name] if via == "distrobox" else [find_toolbx(), "rm", "--force", name],
             timeout=300)
    cp = user.toolbox("create", "--engine", via, *target, timeout=600)
    assert cp.returncode == 0, cp.stdout[-3000:] + cp.stderr[-3000:]
    assert f"created {name}" in cp.stdout

    # the first enter: the argv arrives exactly, python is the image's venv
    cp = user.toolbox("run", "--engine", via, *target, "--", "python", "-c", PROBE, *NASTY, timeout=900)
    assert cp.returncode == 0, cp.stdout[-3000:] + cp.stderr[-3000:]
    argv, prefix = _probe_argv(cp.stdout)
    assert argv == NASTY and prefix == "/opt/venv"
    # the host shell's PYTHONPATH (here a folder in the shared home) does not reach the image's Python
    leak = user.home / "host-pythonpath"
    cp = user.toolbox("run", "--engine", via, *target, "--", "python", "-c", "import sys; print(sys.path)",
                      env={"PYTHONPATH": f"{user.pythonpath}{os.pathsep}{leak}"})
    assert cp.returncode == 0 and "/opt/venv" in cp.stdout and str(leak) not in cp.stdout, cp.stdout + cp.stderr
    cp = user.toolbox("run", "--engine", via, *target, "--", "sh", "-c", "echo 'x(y)'")
    assert cp.returncode == 0 and cp.stdout.strip().splitlines()[-1] == "x(y)", cp.stdout + cp.stderr
    if via == "distrobox":
        # the image carries what distrobox-init would otherwise install: no apt-get ran
        logs = user.run(["podman", "logs", name])
        assert "Installing basic packages" in logs.stdout + logs.stderr
        assert "Reading package lists" not in logs.stdout + logs.stderr, (logs.stdout + logs.stderr)[-3000:]

    # a tiny training run; the container shares the user's home, so host paths hold inside
    ws = user.home / f"ws-{via}"
    shutil.rmtree(ws, ignore_errors=True)
    cfg = _train_workspace(ws, tiny_model)
    subprocess.run(["chown", "-R", f"{user.uid}:{user.gid}", str(ws)], check=True)
    # --debug: a failure here shows its traceback (a CI run once failed on an import inside transformers that
    # printed only "Could not import module 'BloomPreTrainedModel'"; it passed alone and in every other run)
    cp = user.toolbox("run", "--engine", via, *target, "--", "finetune", "--debug", "--config", str(cfg), timeout=900)
    assert cp.returncode == 0, cp.stdout[-5000:] + cp.stderr[-5000:]
    _assert_loss_went_down(ws / "out")
    assert (ws / "out" / "adapter_model.safetensors").is_file()
    assert (ws / "out" / "metrics.jsonl").stat().st_uid == user.uid  # the user's, not root's

    # doctor: the tool, the container, its labels against the stack, the probe inside
    cp = user.toolbox("doctor", "--engine", via, "--name", name, "--in-image", timeout=600)
    assert cp.returncode == 0, cp.stdout + cp.stderr
    assert f"] container: {name} exists" in cp.stdout and "label pins: all" in cp.stdout
    assert "pin transformers.version: transformers 5.17.0" in cp.stdout
    cp = user.toolbox("doctor", "--engine", via, "--name", "toolbox-ci-none", "--stack", "cpu")
    assert cp.returncode == 1 and f"toolbox create --engine {via} --name toolbox-ci-none" in cp.stdout


def test_distrobox_as_a_user(test_user, cpu_image, tiny_model):
    need("distrobox")
    _container_engine_round(test_user, "distrobox", cpu_image["tag"], tiny_model)


def test_toolbx_as_a_user(test_user, cpu_image, tiny_model):
    from toolbox.engines.toolbx import find_toolbx

    need("toolbox")
    if find_toolbx() is None:
        pytest.fail("podman-toolbox is not installed (.ci/apt-packages.txt lists it)") if os.environ.get("CI") \
            else pytest.skip("Fedora's toolbx is not installed")
    _container_engine_round(test_user, "toolbx", cpu_image["tag"], tiny_model)


def test_readme_tells_the_two_toolbox_commands_apart(tmp_path):
    """With Fedora's toolbx installed next to this project: README's advice holds."""
    from toolbox.engines.toolbx import find_toolbx

    fedora = find_toolbx()
    if fedora is None:
        pytest.skip("Fedora's toolbx is not installed")
    readme = (ROOT / "README.md").read_text()
    ours_says = re.search(r"`toolbox --version` prints `([^`]+)`", readme).group(1)
    fedoras_says = re.search(r"Fedora's prints `([^`]+)`", readme).group(1)
    fedora_out = subprocess.run([fedora, "--version"], capture_output=True, text=True).stdout.strip()
    assert fedora_out.startswith(fedoras_says.split("0.x")[0]) and re.match(r"toolbox version 0\.", fedora_out)
    # ours, as an installed entry script (a stand-in made like pip's) and as python -m toolbox
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    script = bin_dir / "toolbox"
    script.write_text(f"#!{os.sys.executable}\nimport sys\nfrom toolbox.cli import main\nsys.exit(main())\n")
    script.chmod(0o755)
    env = {"PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "entrypoints")])}
    for path in (f"{bin_dir}:{os.path.dirname(fedora)}", f"{os.path.dirname(fedora)}:{bin_dir}"):
        found = subprocess.run(["sh", "-c", "toolbox --version"], capture_output=True, text=True,
                               env={**os.environ, **env, "PATH": path + ":/usr/bin:/bin"}).stdout.strip()
        assert found in (ours_says, fedora_out)  # the first on PATH answers, and says which it is
    assert toolbox("--version").stdout.strip() == ours_says  # python -m toolbox: always ours
    # and the engine finds Fedora's binary whichever comes first
    for path in (f"{bin_dir}:{os.path.dirname(fedora)}", f"{os.path.dirname(fedora)}:{bin_dir}"):
        cp = toolbox("run", "--engine", "toolbx", "--stack", "cpu", "--name", "x", "--dry-run", "--", "true",
                     env={"PATH": path + ":/usr/bin:/bin", "TOOLBOX_TOOLBX": ""})
        assert cp.stdout.split()[0] == fedora, cp.stdout + cp.stderr
