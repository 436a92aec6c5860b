"""The engine layer on a tiny Dockerfile of our own: real podman builds and runs, the
Docker SDK against podman's API socket, build secrets, failed builds, bad input."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from helpers.enginekit import need, podman, toolbox
from toolbox.engines import BuildSpec, Mount, RunSpec
from toolbox.errors import ToolError

SECRET = "-----BEGIN CERTIFICATE-----\nTOOLBOX-TEST-SECRET-3f9a1c\n-----END CERTIFICATE-----\n"
MARK = "TOOLBOX-TEST-SECRET-3f9a1c"


def tiny_context(tmp_path: Path, base: str, fail: bool = False) -> Path:
    ctx = tmp_path / "ctx"
    ctx.mkdir()
    (ctx / "hello.txt").write_text("hello from the context\n")
    steps = [
        f"FROM {base}",
        "COPY hello.txt /opt/hello.txt",
        # the secret is readable during the step; the layer only keeps its hash
        "RUN --mount=type=secret,id=ca if [ -f /run/secrets/ca ]; then sha256sum /run/secrets/ca | cut -c1-64 > /opt/ca.sha; fi",
    ]
    if fail:
        steps.append("RUN echo about to fail && exit 3")
    steps.append('LABEL io.github.toolbox.stack="tiny"')
    (ctx / "Dockerfile").write_text("\n".join(steps) + "\n")
    return ctx


@pytest.fixture
def secret_file(tmp_path) -> Path:
    f = tmp_path / "ca.pem"
    f.write_text(SECRET)
    return f


def _assert_secret_absent(tag: str):
    hist = podman("history", "--no-trunc", "--format", "{{.CreatedBy}}", tag).stdout
    assert MARK not in hist
    insp = podman("image", "inspect", tag).stdout
    assert MARK not in insp
    # the whole filesystem of the image, as a tar stream
    cid = podman("create", tag, "true").stdout.strip()
    try:
        out = subprocess.run(["podman", "export", cid], capture_output=True, check=True).stdout
    finally:
        podman("rm", "-f", cid)
    assert MARK.encode() not in out


def test_podman_build_run_secret_and_mounts(base_image, tmp_path, secret_file, monkeypatch):
    need("podman")
    from toolbox.engines.podman import PodmanEngine

    eng = PodmanEngine()
    tag = "localhost/toolbox-test-tiny:podman"
    lines: list[str] = []
    res = eng.build(BuildSpec(context=tiny_context(tmp_path, base_image), tag=tag, secrets={"ca": secret_file}), lines.append)
    assert any(line.startswith("STEP 3/") for line in lines), "build output was not streamed"
    assert res.labels.get("io.github.toolbox.stack") == "tiny"
    assert eng.image_info(tag)["id"].startswith(res.image_id)
    _assert_secret_absent(tag)

    out = tmp_path / "out"
    out.mkdir()
    monkeypatch.setenv("TOOLBOX_TEST_TOKEN", "value-not-on-argv-81b2")
    spec = RunSpec(
        image=tag,
        command=["sh", "-c", 'cat /opt/ca.sha > /out/ca.sha; printf %s "$TOOLBOX_TEST_TOKEN" > /out/token; cat /opt/hello.txt > /out/hello'],
        mounts=[Mount(str(out), "/out")],
        env_names=["TOOLBOX_TEST_TOKEN"],
        ipc_host=True,
    )
    argv = eng.run_command(spec)
    assert "value-not-on-argv-81b2" not in " ".join(argv)
    assert ["-e", "TOOLBOX_TEST_TOKEN"] == argv[argv.index("-e"):argv.index("-e") + 2]
    assert eng.run(spec) == 0
    import hashlib

    assert (out / "ca.sha").read_text().strip() == hashlib.sha256(SECRET.encode()).hexdigest()
    assert (out / "token").read_text() == "value-not-on-argv-81b2"
    assert (out / "hello").read_text() == "hello from the context\n"
    assert (out / "hello").stat().st_uid == os.geteuid()


def test_podman_failed_build_names_step_and_tags_nothing(base_image, tmp_path):
    need("podman")
    from toolbox.engines.podman import PodmanEngine

    eng = PodmanEngine()
    tag = "localhost/toolbox-test-tiny:broken"
    podman("rmi", "-f", tag, check=False)
    with pytest.raises(ToolError) as exc:
        eng.build(BuildSpec(context=tiny_context(tmp_path, base_image, fail=True), tag=tag), lambda _l: None)
    msg = str(exc.value)
    assert "STEP 4/5" in msg and "about to fail" in msg and "no image was tagged" in msg
    assert eng.image_info(tag) is None


def test_docker_sdk_against_podman_socket(base_image, podman_socket, tmp_path, secret_file):
    from toolbox.engines.docker import DockerEngine

    eng = DockerEngine(base_url=podman_socket)
    assert eng.available() and eng.is_podman()
    tag = "localhost/toolbox-test-tiny:docker-sdk"
    lines: list[str] = []
    res = eng.build(BuildSpec(context=tiny_context(tmp_path, base_image), tag=tag, secrets={"ca": secret_file}), lines.append)
    assert res.labels.get("io.github.toolbox.stack") == "tiny"
    assert any("STEP 3/" in line for line in lines)
    _assert_secret_absent(tag)
    out = tmp_path / "out"
    out.mkdir()
    rc = eng.run(RunSpec(image=tag, command=["sh", "-c", "cp /opt/ca.sha /out/ && exit 7"],
                         mounts=[Mount(str(out), "/out")], ipc_host=True))
    assert rc == 7  # the container's own exit code comes back
    assert len((out / "ca.sha").read_text().strip()) == 64
    # a failing build through the API: no tag left either
    with pytest.raises(ToolError, match="STEP 4/5"):
        (tmp_path / "b").mkdir()
        broken = tiny_context(tmp_path / "b", base_image, fail=True)
        eng.build(BuildSpec(context=broken, tag="localhost/toolbox-test-tiny:docker-broken"), lambda _l: None)
    assert eng.image_info("localhost/toolbox-test-tiny:docker-broken") is None


def test_docker_socket_down_is_one_clear_message(tmp_path):
    cp = toolbox("run", "--engine", "docker", "--image", "x", "--platform", "cpu", "--", "true",
                 env={"DOCKER_HOST": f"unix://{tmp_path}/nobody.sock"})
    assert cp.returncode == 1
    assert "Docker API" in cp.stderr and "podman system service" in cp.stderr
    assert "Traceback" not in cp.stderr


def test_no_engine_installed(tmp_path):
    empty = tmp_path / "bin"
    empty.mkdir()
    env = {"PATH": str(empty), "DOCKER_HOST": ""}
    cp = toolbox("run", "--image", "x", "--platform", "cpu", "--", "true", env=env)
    assert cp.returncode == 1, cp.stderr
    assert "no container engine found" in cp.stderr and "install podman" in cp.stderr.lower()


def test_missing_image(base_image):
    cp = toolbox("run", "--engine", "podman", "--image", "localhost/toolbox-no-such:0", "--platform", "cpu", "--", "true")
    assert cp.returncode == 1
    assert "not found" in cp.stderr and "toolbox build" in cp.stderr
