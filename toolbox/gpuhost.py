"""What the host gives an AMD GPU, read from /proc, /sys and /dev: `toolbox doctor`'s host GPU checks.

The Strix Halo (gfx1151) checks are what its users report breaking, each threshold from a public
record (cited at each check); they run only when sysfs shows a gfx1151 GPU, and are one info line
otherwise. Everything is read below one root (TOOLBOX_SYSFS_ROOT, default /), so the tests run
them against recorded trees (tests/hosts/).
"""

from __future__ import annotations

import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path

from toolbox_train.commands.health import Check

ROOT_ENV = "TOOLBOX_SYSFS_ROOT"  # the same variable the RDMA port choice reads its fake trees by

AMD_VENDOR = "0x1002"
# KFD topology's gfx_target_version is major*10000 + minor*100 + stepping: gfx1151 = 11.5.1.
GFX1151 = 110501
# Strix Halo's PCI device ID (Radeon 8060S): amdgpu_top's "DeviceID":5510 (= 0x1586) beside
# "GFX1151/Strix Halo" (magnitudedev/magnitude #44); a fallback where KFD's topology is absent.
STRIX_HALO_PCI = {"0x1586"}

# kyuz0/amd-strix-halo-toolboxes README (quoted in its issue #69, 2026-03-24): "Kernels older than
# 6.18.4 have a bug that causes stability issues on gfx1151 and should be avoided"; the author's
# comment in #45 (2026-01-13): AMD pushed a fix in 6.18.4.
MIN_KERNEL = (6, 18, 4)
# AMD's Strix Halo system-optimization page (rocm.docs.amd.com/en/latest/how-to/system-optimization/
# strixhalo.html, "Required kernel version"): two KFD fixes (gregkh/linux@7f26af7, @7445db6) are in
# "Ubuntu 24.04 HWE 6.17.0-19.19~24.04.2 or later", "Ubuntu 24.04 OEM 6.14.0-1018 or later", and
# Linux 6.18.4 elsewhere. Ubuntu's uname says 6.17.0-19-generic (version 6.17.0, ABI 19; the upload,
# .19, is in /proc/version_signature): (major, minor, ABI) at or above these is accepted on Ubuntu.
UBUNTU_KERNELS = {"hwe": (6, 17, 19), "oem": (6, 14, 1018)}
# ROCm/legacy-rocm-build #5724 (closed, "amdgpu firmware (MES 0x83) causing GPU Hang / Memory access
# fault w/ Strix Halo"): MES 0x83 hangs; rolled back to 0x80 the hangs stopped.
BAD_MES = {0x83: "ROCm/legacy-rocm-build #5724: MES 0x83 hangs the GPU (0x80 works)"}
# pages of 4 KiB: GiB x 262144 (defilantech/LLMKube #1155, fixed by its PR #1387)
PAGES_PER_GIB = 262144


@dataclass
class Gpu:
    card: str          # card1
    device: Path       # .../sys/class/drm/card1/device
    pci_id: str        # 0x1586
    gfx_target: int | None  # 110501, from KFD's topology

    @property
    def is_gfx1151(self) -> bool:
        return self.gfx_target == GFX1151 or (self.gfx_target is None and self.pci_id in STRIX_HALO_PCI)


def root() -> Path:
    return Path(os.environ.get(ROOT_ENV) or "/")


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def _int(path: Path) -> int | None:
    text = _read(path)
    try:
        return int(text, 0) if text is not None else None
    except ValueError:
        return None


def _gib(n: int) -> str:
    return f"{n / 2**30:.1f} GiB"


def amd_gpus(base: Path) -> list[Gpu]:
    """The amdgpu cards in sysfs, with the gfx target KFD's topology gives each (matched by PCI
    location: the topology node's location_id is the card's bus/device/function)."""
    targets: dict[int, int] = {}
    for props in sorted((base / "sys/class/kfd/kfd/topology/nodes").glob("*/properties")):
        fields = dict(line.split(None, 1) for line in (_read(props) or "").splitlines() if " " in line)
        try:
            target = int(fields.get("gfx_target_version", "0"))
            if target:
                targets[int(fields.get("location_id", "-1"))] = target
        except ValueError:
            continue
    gpus = []
    for card in sorted((base / "sys/class/drm").glob("card*")):
        if not re.fullmatch(r"card\d+", card.name):
            continue  # card1-DP-1 and the like are connectors
        dev = card / "device"
        if _read(dev / "vendor") != AMD_VENDOR:
            continue
        loc = _pci_location(dev)
        target = targets.get(loc) if loc is not None else None
        if target is None and len(targets) == 1:
            target = next(iter(targets.values()))  # one GPU: no need to match
        gpus.append(Gpu(card.name, dev, _read(dev / "device") or "", target))
    return gpus


def _pci_location(dev: Path) -> int | None:
    """KFD's location_id for the device: (bus << 8) | (device << 3) | function."""
    m = re.search(r"[0-9a-f]{4}:([0-9a-f]{2}):([0-9a-f]{2})\.([0-7])$", os.path.realpath(dev))
    if not m:
        return None
    bus, slot, fn = (int(x, 16) for x in m.groups())
    return (bus << 8) | (slot << 3) | fn


def kernel_version(base: Path) -> tuple[str, tuple[int, ...] | None]:
    release = _read(base / "proc/sys/kernel/osrelease") or ""
    m = re.match(r"(\d+)\.(\d+)(?:\.(\d+))?", release)
    return release, (tuple(int(x or 0) for x in m.groups()) if m else None)


def ubuntu_kernel(base: Path) -> tuple[str, tuple[int, int, int, int]] | None:
    """An Ubuntu kernel's line and (major, minor, ABI, upload), from /proc/version_signature
    ("Ubuntu 6.17.0-19.19~24.04.2-generic 6.17.13") or, without it, uname's 6.17.0-19-generic
    (upload unknown: the ABI's first upload, which carries its number). None: not Ubuntu's."""
    sig = _read(base / "proc/version_signature") or ""
    m = re.match(r"Ubuntu (\d+)\.(\d+)\.\d+-(\d+)\.(\d+)\S*-(\w+)", sig)
    if m:
        major, minor, abi, upload, flavour = m.groups()
    else:
        release = _read(base / "proc/sys/kernel/osrelease") or ""
        m = re.fullmatch(r"(\d+)\.(\d+)\.\d+-(\d+)-(generic|oem|lowlatency)", release.strip())
        if not m:
            return None
        major, minor, abi, flavour = m.groups()
        upload = abi
    line = "oem" if flavour == "oem" or int(abi) >= 1000 else "hwe"
    return line, (int(major), int(minor), int(abi), int(upload))


def cmdline_params(base: Path) -> dict[str, str]:
    out = {}
    for word in (_read(base / "proc/cmdline") or "").split():
        key, _, value = word.partition("=")
        out[key] = value
    return out


def mem_total(base: Path) -> int | None:
    m = re.search(r"^MemTotal:\s+(\d+) kB", _read(base / "proc/meminfo") or "", re.M)
    return int(m.group(1)) * 1024 if m else None


# -- the checks ----------------------------------------------------------------------------------

def memory_check(base: Path, gpu: Gpu) -> Check:
    """ROCm on Strix Halo sees only the BIOS carve-out unless the kernel is told to give the GPU
    more of the unified memory (GTT): defilantech/LLMKube #1155 (ROCm saw the ~64 GB carve-out of
    128 GB), kyuz0/amd-strix-halo-toolboxes #39. The setting is ttm.pages_limit (amdgpu.gttsize,
    in MiB, is the deprecated older knob; amdttm.* where AMD's DKMS module replaces ttm)."""
    params = cmdline_params(base)
    set_by = [k for k in ("ttm.pages_limit", "amdttm.pages_limit", "amdgpu.gttsize") if k in params]
    gttsize = _int(base / "sys/module/amdgpu/parameters/gttsize")
    if gttsize is not None and gttsize > 0 and "amdgpu.gttsize" not in set_by:
        set_by.append(f"amdgpu gttsize={gttsize}")
    for conf in sorted((base / "etc/modprobe.d").glob("*.conf")):
        for line in (_read(conf) or "").splitlines():
            m = re.match(r"\s*options\s+(ttm|amdttm)\s+.*\bpages_limit=(\d+)", line)
            if m:
                set_by.append(f"{m.group(1)} pages_limit={m.group(2)} in /etc/modprobe.d/{conf.name}")
    vram = _int(gpu.device / "mem_info_vram_total")
    gtt = _int(gpu.device / "mem_info_gtt_total")
    limit = _int(base / "sys/module/ttm/parameters/pages_limit")
    ram = mem_total(base)
    parts = [f"BIOS carve-out (VRAM) {_gib(vram)}" if vram is not None else "VRAM size unreadable",
             f"GTT {_gib(gtt)}" if gtt is not None else "GTT size unreadable"]
    if limit is not None:
        parts.append(f"ttm pages_limit {limit} ({_gib(limit * 4096)})")
    if ram is not None:
        parts.append(f"RAM {_gib(ram)}")
    detail = ", ".join(parts)
    wanted = {int(v) for k, v in params.items() if k in ("ttm.pages_limit", "amdttm.pages_limit") and v.isdigit()}
    for conf in sorted((base / "etc/modprobe.d").glob("*.conf")):
        wanted |= {int(n) for n in re.findall(r"(?m)^\s*options\s+(?:ttm|amdttm)\s+.*\bpages_limit=(\d+)", _read(conf) or "")}
    live = {n for n in (limit, _int(base / "sys/module/amdttm/parameters/pages_limit")) if n is not None}
    if wanted and live and not wanted & live:
        # ROCm/legacy-rocm-build #5562: amd-ttm wrote /etc/modprobe.d/ttm.conf, but the initramfs and
        # boot entry were not updated, so the running kernel kept its default
        return Check("gpu memory", "fail", f"{detail}; set to {', '.join(map(str, sorted(wanted)))} pages "
                     "but not in effect in the running kernel",
                     "regenerate the initramfs (`sudo dracut -f` / `sudo update-initramfs -u`) and the boot "
                     "entry, then reboot; check /sys/module/ttm/parameters/pages_limit")
    if set_by and limit is not None and ram and limit * 4096 <= ram * 0.55:
        # unslothai/unsloth #7878 (and PR #7960): torch reported 62.47 GiB on a 128 GB Strix Halo because
        # amdgpu.gttsize is deprecated and the TTM page limit was still at its RAM/2 default
        return Check("gpu memory", "fail", f"{detail}; the live ttm pages_limit is the RAM/2 default "
                     f"({', '.join(set_by)} does not raise it): torch sees about half",
                     f"add ttm.pages_limit=<GiB x {PAGES_PER_GIB}> to the kernel command line (96 GiB: "
                     f"ttm.pages_limit={96 * PAGES_PER_GIB}), regenerate the initramfs/boot entry and reboot (unsloth #7878)")
    if set_by:
        return Check("gpu memory", "ok", f"{detail}; set by {', '.join(set_by)}")
    example = 96 * PAGES_PER_GIB
    return Check(
        "gpu memory", "fail",
        f"{detail}; no ttm.pages_limit / amdgpu.gttsize kernel setting: ROCm sees only the BIOS carve-out",
        f"add ttm.pages_limit=<GiB x {PAGES_PER_GIB}> to the kernel command line (pages of 4 KiB; "
        f"96 GiB of a 128 GB machine: ttm.pages_limit={example}), or `options ttm pages_limit={example}` in "
        "/etc/modprobe.d/ttm.conf, then regenerate the initramfs/boot entry and reboot "
        "(defilantech/LLMKube #1155)")


def kernel_check(base: Path) -> Check:
    release, version = kernel_version(base)
    want = ".".join(map(str, MIN_KERNEL))
    if version is None:
        return Check("kernel", "info", f"version unreadable ({release or 'no osrelease'})")
    if version >= MIN_KERNEL:
        return Check("kernel", "ok", f"{release} (>= {want})")
    ubuntu = ubuntu_kernel(base)
    if ubuntu is not None:
        line, (major, minor, abi, upload) = ubuntu
        floor = UBUNTU_KERNELS[line]
        if (major, minor) == floor[:2] and abi >= floor[2]:
            return Check("kernel", "ok", f"{release} (Ubuntu 24.04 {line.upper()} {major}.{minor}.0-{abi}.{upload}: "
                         "has the KFD fixes AMD's Strix Halo page names)")
        return Check("kernel", "fail", f"{release}: an Ubuntu {line.upper()} kernel without the KFD fixes gfx1151 needs",
                     "install the 24.04 HWE kernel >= 6.17.0-19.19~24.04.2 (OEM >= 6.14.0-1018) or boot "
                     f"a kernel >= {want} (AMD's Strix Halo page, rocm.docs.amd.com .../strixhalo.html)")
    return Check("kernel", "fail", f"{release}: older than {want}, which gfx1151 needs for stability",
                 f"boot a kernel >= {want} (kyuz0/amd-strix-halo-toolboxes README and #69); and not with "
                 "linux-firmware 20251125, reported to break ROCm on Strix Halo (same README, #37)")


def mes_check(gpu: Gpu) -> Check:
    """The MES firmware version the kernel loaded: sysfs fw_version/mes_fw_version, "0x%08x" of the
    version masked to its low 12 bits (added to amdgpu in 2023: "drm/amdgpu: Report Missing MES
    Firmware Versions with Sysfs"), so no debugfs is needed."""
    path = gpu.device / "fw_version" / "mes_fw_version"
    text = _read(path)
    if text is None:
        return Check("MES firmware", "info", f"{gpu.card}: no fw_version/mes_fw_version in sysfs (older kernel)")
    try:
        version = int(text, 16)
    except ValueError:
        return Check("MES firmware", "info", f"{gpu.card}: unreadable version {text!r}")
    if version in BAD_MES:
        return Check("MES firmware", "fail", f"{gpu.card}: MES {version:#x}: {BAD_MES[version]}",
                     "install the amdgpu firmware with MES 0x80 (the linux-firmware release before 20251125, "
                     "e.g. Fedora 43: `dnf downgrade amd-gpu-firmware-20251111`) or a newer one without 0x83; "
                     "regenerate the initramfs and reboot")
    return Check("MES firmware", "ok", f"{gpu.card}: MES {version:#x}")


def device_access(path: Path, uid: int, gids: set[int]) -> tuple[bool, str]:
    """Whether UID with groups GIDS may read and write the device node PATH, and the group to
    join when not (the node's own: render for /dev/kfd and renderD*, video on some distros)."""
    try:
        st = path.stat()
    except OSError:
        return False, ""
    import grp

    try:
        group = grp.getgrgid(st.st_gid).gr_name
    except KeyError:
        group = str(st.st_gid)
    rw = stat.S_IRUSR | stat.S_IWUSR
    if uid == 0:
        return True, group
    if st.st_uid == uid and st.st_mode & rw == rw:
        return True, group
    if st.st_gid in gids and st.st_mode & (rw >> 3) == rw >> 3:
        return True, group
    return st.st_mode & (rw >> 6) == rw >> 6, group


def device_checks(base: Path, uid: int | None = None, gids: set[int] | None = None) -> list[Check]:
    uid = os.geteuid() if uid is None else uid
    gids = set(os.getgroups()) | {os.getegid()} if gids is None else gids
    nodes = [base / "dev/kfd", *sorted((base / "dev/dri").glob("renderD*"))]
    out = []
    if not (base / "dev/kfd").exists():
        out.append(Check("/dev/kfd", "fail", "missing: no ROCm compute device",
                         "load the amdgpu driver (`sudo modprobe amdgpu`) and check `dmesg | grep -i kfd`"))
        nodes = nodes[1:]
    if not list((base / "dev/dri").glob("renderD*")):
        out.append(Check("/dev/dri", "fail", "no render node (/dev/dri/renderD*)",
                         "load the amdgpu driver (`sudo modprobe amdgpu`)"))
    for node in nodes:
        ok, group = device_access(node, uid, gids)
        shown = "/" + str(node.relative_to(base))
        out.append(Check(shown, "ok" if ok else "fail",
                         f"read/write ({group})" if ok else f"no read/write access (group {group})",
                         "" if ok else f"sudo usermod -aG {group} $USER, then log in again"))
    return out


def gpu_checks(base: Path | None = None, *, rocm: bool = True, uid: int | None = None,
               gids: set[int] | None = None) -> list[Check]:
    """The host GPU checks: device access (ROCm stacks), then the Strix Halo ones per gfx1151 GPU."""
    base = root() if base is None else base
    out = device_checks(base, uid, gids) if rocm else []
    gpus = amd_gpus(base)
    halo = [g for g in gpus if g.is_gfx1151]
    if not halo:
        seen = ", ".join(f"{g.card} {g.pci_id}" + (f" gfx target {g.gfx_target}" if g.gfx_target else "")
                         for g in gpus) or "no AMD GPU"
        out.append(Check("strix halo", "info", f"no gfx1151 GPU in sysfs ({seen}): Strix Halo checks skipped"))
        return out
    out.append(kernel_check(base))
    for gpu in halo:
        out.append(memory_check(base, gpu))
        out.append(mes_check(gpu))
    return out
