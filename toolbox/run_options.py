"""Run options: what a stack needs from a container engine to run (devices, groups, mounts,
env, user) and the image tag of a stack. (Not the Dockerfile's runtime stage: dockerfiles/runtime/.)

Shared by `toolbox run`, `toolbox create` and `toolbox doctor`; the engines in
toolbox/engines/ only turn the resulting RunSpec into commands.
"""

from __future__ import annotations

import grp
import os
from pathlib import Path

from toolbox.engines import Mount, RunSpec
from toolbox.errors import ToolError, UserError

# Passed by name (`-e NAME`) when set on the host, so a value never shows in argv.
PASSTHROUGH_ENV = (
    "HF_TOKEN",
    "HUGGING_FACE_HUB_TOKEN",
    "HF_HUB_OFFLINE",
    "HF_ENDPOINT",
    "WANDB_API_KEY",
    "WANDB_MODE",
    "NCCL_SOCKET_IFNAME",
    "GLOO_SOCKET_IFNAME",
    "NCCL_IB_DISABLE",
    "NCCL_DEBUG",
    "HSA_OVERRIDE_GFX_VERSION",
)
CONTAINER_WORKSPACE = "/workspace"
CONTAINER_HF_CACHE = "/hf-cache"


def default_tag(stack) -> str:
    """Two different pin sets never share a tag: the tag carries the stack's digest."""
    return f"localhost/toolbox-{stack.model.name}:{stack.digest()}"


def _group_ref(name: str) -> str:
    # Devices are owned by the host's GIDs; an image may lack a `render` group by name.
    try:
        return str(grp.getgrnam(name).gr_gid)
    except KeyError:
        return name


def check_rocm_host(dev_root: str = "/dev") -> None:
    kfd = Path(dev_root) / "kfd"
    if not kfd.exists():
        raise ToolError(
            f"this is a ROCm stack but {kfd} does not exist on this host, so the container would "
            "see no GPU. Check that the amdgpu kernel driver is loaded (`lsmod | grep amdgpu`, "
            "`ls -l /dev/kfd /dev/dri`), or run a CPU stack (`--stack cpu`)."
        )


def gpu_options(platform: str, spec: RunSpec, dev_root: str = "/dev", rootless: bool = False) -> None:
    """ROCm: the device nodes and the groups that own them. A rootful engine adds the host's
    video/render GIDs by number (an image may lack a `render` group by name, and then
    `--group-add render` fails at start). Rootless podman (and distrobox on it) cannot map host
    GIDs into its user namespace: `--group-add keep-groups` keeps the caller's own groups."""
    if platform == "rocm":
        spec.devices += [f"{dev_root}/kfd", f"{dev_root}/dri"]
        spec.groups += ["keep-groups"] if rootless else [_group_ref("video"), _group_ref("render")]
        spec.security_opts.append("seccomp=unconfined")
        if Path(dev_root, "infiniband").exists():
            spec.devices.append(f"{dev_root}/infiniband")
            if not rootless:
                spec.groups.append(_group_ref("rdma"))
            spec.ulimits["memlock"] = "-1:-1"
    elif platform == "cuda":
        spec.gpus = "all"


def parse_mount(text: str) -> Mount:
    parts = text.split(":")
    if len(parts) not in (2, 3) or not parts[0] or not parts[1]:
        raise UserError(f"--mount {text!r}: expected SRC:DST or SRC:DST:ro")
    src, dst = parts[0], parts[1]
    mode = parts[2] if len(parts) == 3 else "rw"
    if mode not in ("ro", "rw"):
        raise UserError(f"--mount {text!r}: the third field must be ro or rw, got {mode!r}")
    if not os.path.isabs(dst):
        raise UserError(f"--mount {text!r}: DST must be an absolute path inside the container")
    srcp = Path(src).expanduser()
    if not srcp.exists():
        raise UserError(f"--mount {text!r}: SRC {srcp} does not exist on the host")
    return Mount(str(srcp.resolve()), dst, mode)


def hf_cache_dir() -> Path:
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"])
    xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(xdg) / "huggingface"


def user_options(engine: str, spec: RunSpec) -> None:
    """Make files written in mounts belong to the caller."""
    euid = os.geteuid()
    if euid != 0:
        if engine == "podman":
            spec.keep_id = True  # rootless: the caller's uid is the same inside
        else:
            spec.user = f"{euid}:{os.getegid()}"  # a rootful daemon: run as the caller
            spec.env.setdefault("HOME", "/tmp")
    elif os.environ.get("SUDO_UID"):
        # `sudo toolbox run`: root's uid would own the outputs; use the sudo caller's.
        spec.user = f"{os.environ['SUDO_UID']}:{os.environ.get('SUDO_GID', os.environ['SUDO_UID'])}"
        spec.env.setdefault("HOME", "/tmp")
    # plain root: container root is host root, which is the caller; keep-id is moot there


def run_spec(
    *,
    engine: str,
    platform: str,
    image: str,
    command: list[str],
    name: str | None = None,
    workspace: Path | None = None,
    mounts: list[str] = (),
    network: str | None = None,
    extra_env: list[str] = (),
    hf_cache: Path | None = None,
    dev_root: str = "/dev",
    create_cache: bool = True,
) -> RunSpec:
    spec = RunSpec(image=image, command=list(command), name=name, ipc_host=True, network=network)
    gpu_options(platform, spec, dev_root, rootless=engine == "podman" and os.geteuid() != 0)
    ws = (workspace or Path.cwd()).resolve()
    spec.mounts.append(Mount(str(ws), CONTAINER_WORKSPACE))
    spec.workdir = CONTAINER_WORKSPACE
    cache = hf_cache or hf_cache_dir()
    if create_cache:  # not for a dry run: it changes nothing on the host
        try:
            cache.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise UserError(f"--hf-cache {cache}: cannot create it: {exc.strerror}") from None
    spec.mounts.append(Mount(str(cache.resolve()), CONTAINER_HF_CACHE))
    spec.env["HF_HOME"] = CONTAINER_HF_CACHE
    for m in mounts:
        spec.mounts.append(parse_mount(m))
    for n in extra_env:
        if "=" in n:
            raise UserError(
                f"--env {n.split('=', 1)[0]}=...: pass variables by name only (export it, then "
                f"--env {n.split('=', 1)[0]}) so the value never appears in a process list"
            )
        if not n.replace("_", "a").isalnum():
            raise UserError(f"--env {n!r}: not an environment variable name")
    names = list(dict.fromkeys([*PASSTHROUGH_ENV, *extra_env]))
    spec.env_names = [n for n in names if n in os.environ]
    user_options(engine, spec)
    return spec
