"""PyTorch (+ torchvision, torchaudio) at exact versions from the stack's index."""

import shlex

from toolbox.components import Component


def device_extra(stack) -> str:
    """`[device-gfx1151]` for a multi-arch index (TheRock RELEASES.md, multi-arch PyTorch): the
    extra pulls amd-torch-device-<target> and rocm-sdk-device-<target>, the GPU code; without it
    pip installs host code only."""
    if not stack.torch.multi_arch:
        return ""
    return "[" + ",".join(f"device-{t}" for t in stack.gpu_targets) + "]"


def requirements(stack) -> list[str]:
    t = stack.torch
    extra = device_extra(stack)
    reqs = [f"torch{extra}=={t.torch}"]
    if t.torchvision:
        reqs.append(f"torchvision{extra}=={t.torchvision}")
    if t.torchaudio:
        reqs.append(f"torchaudio=={t.torchaudio}")
    return reqs


def install_requirements(stack) -> list[str]:
    """What pip installs: requirements() where a wheel is pinned by URL and sha256 (first use),
    `name[extra] @ URL#sha256=...`, whose hash pip checks; then each pinned wheel coupled to them
    (device wheels, triton, rocm-sdk-*, the rocm sdist, rocm-bootstrap), `name @ URL#sha256=...`:
    a direct URL is the only candidate pip has for that name. setuptools (the rocm sdist's build
    backend) is not among them: closed_set() installs it first."""
    out = []
    wheels = {n: hashed(ref) for n, ref in stack.torch.wheels.items()}
    for req in requirements(stack):
        name = req.split("[", 1)[0].split("==", 1)[0]
        ref = wheels.get(name)
        out.append(f"{req.split('==', 1)[0]} @ {ref}" if ref else req)
    own = ("torch", "torchvision", "torchaudio", "setuptools")
    return out + [f"{name} @ {ref}" for name, ref in sorted(wheels.items()) if name not in own]


def hashed(ref: str) -> str:
    """A wheel ref as the image installs it: a URL whose sha256 is left to first use (`toolbox
    build` fills it in) renders as #sha256=UNVERIFIED, which no file matches, as the tarball's does."""
    return ref if "#sha256=" in ref else f"{ref}#sha256=UNVERIFIED"


def closed_set(stack) -> dict | None:
    """The image's torch step where the stack pins the whole ROCm set by URL (the `rocm` sdist
    included), else None (torch from its index). Each list is one command's arguments:
    `setuptools`: installed first, so the `rocm` sdist builds without an index; `install`: the set,
    with --no-index --no-deps (no index can supply any part of it, not even PyPI's placeholders of
    rocm, rocm-sdk-core, amd-torch-device-gfx115x, rocm-bootstrap); `check`: requires.py --closed,
    which fails unless every requirement a wheel of the set has on a ROCm name is met by another;
    `env`: for the sdist's build, which would ask offload-arch (no GPU in a build) for the target."""
    wheels = stack.torch.wheels
    if "torch" not in wheels or "rocm" not in wheels:
        return None
    head = ["--no-index", "--no-deps"]
    return {"setuptools": [*head, f"setuptools @ {hashed(wheels['setuptools'])}"] if "setuptools" in wheels else [],
            "install": [*head, "--no-build-isolation", *install_requirements(stack)],
            "check": ["--closed", *requirements(stack)],
            "env": {"ROCM_SDK_TARGET_FAMILY": stack.gpu_targets[0], "ROCM_BOOTSTRAP_DISABLE_DETECTION": "1"}}


def _pins(stack):
    t = stack.torch
    pins = {"torch.version": t.torch}
    if t.torchvision:
        pins["torchvision.version"] = t.torchvision
    if t.torchaudio:
        pins["torchaudio.version"] = t.torchaudio
    if t.index_url:
        pins["torch.index_url"] = t.index_url
    if t.multi_arch:
        pins["torch.device_extra"] = device_extra(stack)
    for name, ref in sorted(t.wheels.items()):
        pins[f"{name}.wheel_sha256"] = ref.rsplit("#sha256=", 1)[1] if "#sha256=" in ref else "unverified"
    return pins


COMPONENT = Component("torch", applies=lambda s: True, pins=_pins, runtime="runtime/torch.j2",
                      # Quoted for the RUN shell: a [device-...] extra is a glob pattern there.
                      # torch_reqs: what later pip steps repeat to keep torch as it is (versions: already
                      # satisfied); torch_install_reqs: what the torch step installs (pinned wheel URLs).
                      variables=lambda s, pin_set: {"torch_reqs": [shlex.quote(r) for r in requirements(s)],
                                                 "torch_install_reqs": [shlex.quote(r) for r in install_requirements(s)],
                                                 "torch_closed": _quoted(closed_set(s))})


def _quoted(steps: dict | None) -> dict | None:
    if steps is None:
        return None
    return {k: ([f"{n}={shlex.quote(v)}" for n, v in a.items()] if k == "env" else [shlex.quote(x) for x in a])
            for k, a in steps.items()}
