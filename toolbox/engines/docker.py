"""Docker through the Docker SDK (`docker` package), which also drives podman's
Docker-compatible API (`podman system service`)."""

from __future__ import annotations

import json
import os
import re
import secrets as _secrets
import subprocess
import sys
import tarfile
import tempfile
from collections import deque
from pathlib import Path

from toolbox.engines.base import ImageEngine, LineSink, build_failure, iid_tempdir, stream_build
from toolbox.engines.spec import BuildResult, BuildSpec, RunSpec
from toolbox.errors import ToolError

_SOCKETS = ("/var/run/docker.sock", "/run/podman/podman.sock")


def _default_url() -> str | None:
    if os.environ.get("DOCKER_HOST"):
        return os.environ["DOCKER_HOST"]
    xdg = os.environ.get("XDG_RUNTIME_DIR")
    candidates = list(_SOCKETS) + ([f"{xdg}/podman/podman.sock", f"{xdg}/docker.sock"] if xdg else [])
    for path in candidates:
        if os.path.exists(path):
            return f"unix://{path}"
    return None


def _cli_version(cli: str) -> tuple[int, ...] | None:
    try:
        out = subprocess.run([cli, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    m = re.search(r"version (\d+)\.(\d+)", out)
    return (int(m.group(1)), int(m.group(2))) if m else None


def find_buildkit_cli() -> tuple[str | None, str]:
    """(a docker CLI that can run a BuildKit build, "") or (None, why none can).

    CLIs before 23.0 carry a BuildKit client (DOCKER_BUILDKIT=1); from 23.0 `docker build`
    is buildx, a separate plugin. TOOLBOX_DOCKER_CLI names one; else every `docker` on PATH."""
    explicit = os.environ.get("TOOLBOX_DOCKER_CLI")
    if explicit:
        candidates = [explicit]
    else:
        candidates, seen = [], set()
        for d in os.environ.get("PATH", "").split(os.pathsep):
            path = os.path.join(d or ".", "docker")
            if os.path.isfile(path) and os.access(path, os.X_OK) and os.path.realpath(path) not in seen:
                seen.add(os.path.realpath(path))
                candidates.append(path)
    reasons = []
    for cli in candidates:
        try:
            if subprocess.run([cli, "buildx", "version"], capture_output=True, timeout=30).returncode == 0:
                return cli, ""
        except (OSError, subprocess.TimeoutExpired) as exc:
            reasons.append(f"{cli}: {exc}")
            continue
        version = _cli_version(cli)
        if version is not None and version < (23, 0):
            return cli, ""
        reasons.append(f"{cli} ({'.'.join(map(str, version)) if version else 'version unknown'}) has no buildx plugin")
    return None, "; ".join(reasons) or "no `docker` CLI on PATH"


class DockerEngine(ImageEngine):
    name = "docker"

    def __init__(self, base_url: str | None = None):
        self.base_url = base_url or _default_url()
        self._client = None

    def available(self) -> bool:
        if not self.base_url:
            return False
        try:
            self.client().ping()
            return True
        except ToolError:
            return False

    def missing_hint(self) -> str:
        if not self.base_url:
            return (
                "no Docker API socket: set DOCKER_HOST, start Docker (`systemctl start docker`), or "
                "serve podman's API (`podman system service --time=0 unix:///run/podman/podman.sock &` "
                "then `export DOCKER_HOST=unix:///run/podman/podman.sock`)"
            )
        return f"the Docker API at {self.base_url} does not answer: is the daemon (or `podman system service`) running?"

    def client(self):
        if self._client is None:
            import docker
            from docker.errors import DockerException

            if not self.base_url:
                raise ToolError(self.missing_hint())
            try:
                self._client = docker.DockerClient(base_url=self.base_url, timeout=600)
                self._client.ping()
            except DockerException as exc:
                self._client = None
                raise ToolError(
                    f"cannot reach the Docker API at {self.base_url}: {exc}. {self.missing_hint()}"
                ) from exc
        return self._client

    def is_podman(self) -> bool:
        comps = self.client().version().get("Components") or []
        return any("podman" in (c.get("Name") or "").lower() for c in comps)

    # -- build --------------------------------------------------------------
    def _cli_argv(self, spec: BuildSpec, iidfile: str, cli: str = "docker") -> list[str]:
        return [cli, "build", *spec.cli_args(iidfile)]

    def build_commands(self, spec: BuildSpec) -> list[list[str]]:
        # The SDK makes API calls; these are the equivalent docker CLI commands.
        cli = find_buildkit_cli()[0] or "docker"
        return [
            ["env", f"DOCKER_HOST={self.base_url or 'unix:///var/run/docker.sock'}", "DOCKER_BUILDKIT=1",
             *self._cli_argv(spec, "$IIDFILE", cli)],
            [cli, "tag", "$(cat $IIDFILE)", spec.tag],
        ]

    def build(self, spec: BuildSpec, sink: LineSink) -> BuildResult:
        if self.is_podman():
            iid, log = self._build_api(spec, sink)
        else:
            iid, log = self._build_buildkit_cli(spec, sink)
        client = self.client()
        image = client.images.get(iid)
        repo, _, tag = spec.tag.rpartition(":")
        if not repo or "/" in tag:
            repo, tag = spec.tag, "latest"
        image.tag(repo, tag)
        return self.built(iid, spec.tag, log)

    def _build_api(self, spec: BuildSpec, sink: LineSink) -> tuple[str, list[str]]:
        """POST /build with podman's `secrets` parameter: the secret files ride in the
        context tar and podman moves them out of the context before the build."""
        from docker.errors import APIError

        from toolbox.engines.docker_api import post_build

        log: deque[str] = deque(maxlen=400)
        secret_opts = []
        with tempfile.TemporaryFile() as fh:
            with tarfile.open(fileobj=fh, mode="w") as tar:
                for entry in sorted(Path(spec.context).iterdir()):
                    tar.add(entry, arcname=entry.name)
                for sid, src in sorted(spec.secrets.items()):
                    arc = f".toolbox-secret-{_secrets.token_hex(8)}"
                    tar.add(str(src), arcname=arc)
                    secret_opts.append(f"id={sid},src={arc}")
            fh.seek(0)
            params = {
                "dockerfile": spec.dockerfile,
                "rm": True,
                "forcerm": True,
                "nocache": spec.no_cache,
                "layers": True,
            }
            if spec.target:
                params["target"] = spec.target
            if spec.network:
                params["networkmode"] = spec.network
            if spec.build_args:
                params["buildargs"] = json.dumps(spec.build_args)
            if secret_opts:
                params["secrets"] = json.dumps(secret_opts)
            iid = ""
            error = None
            try:
                for chunk in post_build(self.client().api, fh, params):
                    if "stream" in chunk:
                        for line in chunk["stream"].splitlines():
                            log.append(line)
                            sink(line)
                    if "error" in chunk:
                        error = chunk["error"].strip()
                        log.append(error)
                        sink(error)
                    aux = chunk.get("aux") or {}
                    if aux.get("ID"):
                        iid = aux["ID"]
            except APIError as exc:
                raise build_failure("docker-api", list(log), str(exc)) from exc
            if error or not iid:
                raise build_failure("docker-api", list(log), error or "no image id in the API's answer")
        return iid, list(log)

    def _build_buildkit_cli(self, spec: BuildSpec, sink: LineSink) -> tuple[str, list[str]]:
        # Docker's /build endpoint without a BuildKit session knows no RUN --mount, so
        # against a real Docker daemon the BuildKit client (a docker CLI) does the build.
        cli, why_not = find_buildkit_cli()
        if cli is None:
            raise ToolError(
                "the stack's Dockerfile needs BuildKit (RUN --mount), which the Docker API's /build "
                f"endpoint cannot drive without a BuildKit-capable docker CLI: {why_not}. Install the "
                "buildx plugin (`docker-buildx`/`docker-buildx-plugin`), point TOOLBOX_DOCKER_CLI at a "
                "docker CLI older than 23 (BuildKit built in, e.g. Debian's /usr/bin/docker), or use "
                "--engine podman"
            )
        with iid_tempdir() as tmp:
            iidfile = os.path.join(tmp, "iid")
            env = dict(os.environ, DOCKER_HOST=self.base_url or "", DOCKER_BUILDKIT="1")
            return stream_build("docker", self._cli_argv(spec, iidfile, cli) + ["--progress=plain"],
                                iidfile, sink, env=env)

    def image_info(self, ref: str) -> dict | None:
        from docker.errors import ImageNotFound

        try:
            image = self.client().images.get(ref)
        except ImageNotFound:
            return None
        attrs = image.attrs
        return {
            "id": image.id,
            "size": attrs.get("Size", 0),
            "labels": (attrs.get("Config") or {}).get("Labels") or {},
            "layers": (attrs.get("RootFS") or {}).get("Layers") or [],
        }

    # -- run ----------------------------------------------------------------
    def run_command(self, spec: RunSpec) -> list[str]:
        """The docker CLI command equivalent to the API calls `run` makes."""
        return spec.run_argv(["docker", "run"], "docker")

    def run(self, spec: RunSpec) -> int:
        import docker
        from docker.errors import APIError, ImageNotFound

        client = self.client()
        kwargs: dict = {
            "command": spec.command,
            "detach": True,
            "devices": [f"{d}:{d}:rwm" for d in spec.devices],
            "group_add": spec.groups or None,
            "security_opt": spec.security_opts or None,
            "ulimits": [
                docker.types.Ulimit(name=n, soft=_lim(v.split(":")[0]), hard=_lim(v.split(":")[-1]))
                for n, v in sorted(spec.ulimits.items())
            ]
            or None,
            "volumes": {m.source: {"bind": m.target, "mode": m.mode} for m in spec.mounts},
            # values travel in the API request body, never on a command line
            "environment": {**spec.env, **{n: os.environ[n] for n in spec.env_names if n in os.environ}},
            "working_dir": spec.workdir,
            "user": spec.user,
            "name": spec.name,
            "tty": spec.tty,
        }
        if spec.ipc_host:
            kwargs["ipc_mode"] = "host"
        if spec.network:
            kwargs["network_mode"] = spec.network
        if spec.gpus:
            kwargs["device_requests"] = [docker.types.DeviceRequest(count=-1, capabilities=[["gpu"]])]
        try:
            container = client.containers.create(spec.image, **{k: v for k, v in kwargs.items() if v is not None})
        except ImageNotFound as exc:
            raise ToolError(f"image {spec.image!r} not found: build it with `toolbox build`") from exc
        except APIError as exc:
            raise ToolError(f"cannot create the container: {exc.explanation or exc}") from exc
        try:
            # Attached before it starts, as `docker run` does: following the logs of a container
            # that may already have exited hung in podman's API (CI: 600 s read timeout).
            output = container.attach(stdout=True, stderr=True, stream=True, logs=True)
            container.start()
            for chunk in output:
                sys.stdout.write(chunk.decode(errors="replace"))
                sys.stdout.flush()
            return int(container.wait().get("StatusCode", 1))
        finally:
            if spec.remove:
                try:
                    container.remove(force=True)
                except APIError:
                    pass


def _lim(v: str) -> int:
    return -1 if v in ("-1", "unlimited") else int(v)
