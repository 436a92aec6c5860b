"""The OS layer: base image, toolbx/distrobox packages, the /opt/venv Python environment."""

from toolbox.components import Component

# What toolbx and distrobox expect inside an image (they add the user and sudo rule at create).
TOOLBX_PACKAGES = {
    "fedora": ["bash", "findutils", "hostname", "iproute", "less", "passwd", "procps-ng",
               "shadow-utils", "sudo", "tar", "util-linux", "which"],
    "debian": ["bash", "findutils", "hostname", "iproute2", "less", "passwd", "procps",
               "sudo", "tar", "util-linux"],
}
# What the steps and the runtime need besides toolbx's list.
RUNTIME_PACKAGES = {
    "fedora": ["ca-certificates", "curl", "gzip", "libatomic", "numactl-libs", "xz"],
    "debian": ["ca-certificates", "curl", "gzip", "python3-venv", "xz-utils"],
}
# Compilers and sources: builder stages only, never the runtime stage.
DEVEL_PACKAGES = {
    "fedora": ["ccache", "cmake", "gcc-c++", "git-core", "make", "ninja-build", "patch", "python3-devel"],
    "debian": ["build-essential", "ccache", "cmake", "git", "ninja-build", "patch", "python3-dev"],
}


def os_packages(stack, kind: str) -> list[str]:
    fam = stack.base.family
    table = {"toolbx": TOOLBX_PACKAGES, "runtime": RUNTIME_PACKAGES, "devel": DEVEL_PACKAGES}[kind]
    pkgs = list(table[fam])
    if kind == "runtime" and fam == "fedora":
        pkgs.append(stack.base.python)
    if kind == "runtime" and fam == "debian":
        pkgs.append("python3")
    return sorted(set(pkgs))


def _pins(stack):
    pins = {"base.image": stack.base.image}
    if stack.base.digest:
        pins["base.digest"] = stack.base.digest
    return pins


COMPONENT = Component("base", applies=lambda s: True, pins=_pins, builder="stages/base.j2")
