"""`toolbox doctor`'s host GPU checks against sysfs/proc trees laid out as the kernel's (tests/hosts/,
values from the public records each check cites): a Strix Halo host set up as advised, one as users
report it breaking, and a non-gfx1151 Radeon for which the Strix Halo checks are only an info line."""

from __future__ import annotations

import grp
import json
import os
import shutil
from pathlib import Path

import pytest

from toolbox import cli, gpuhost

HOSTS = Path(__file__).resolve().parent / "hosts"


def doctor(capsys, monkeypatch, tree: Path, *extra: str) -> tuple[int, str]:
    monkeypatch.setenv(gpuhost.ROOT_ENV, str(tree))
    code = cli.main(["doctor", "--gpu-only", *extra])
    out = capsys.readouterr()
    assert "Traceback" not in out.err
    return code, out.out


def lines(out: str, name: str) -> list[str]:
    """The check's line and its fix: line."""
    got = out.splitlines()
    i = next(i for i, line in enumerate(got) if line.split("] ", 1)[-1].startswith(name + ":"))
    return got[i:i + 2]


def test_good_strix_halo_host_passes(capsys, monkeypatch):
    code, out = doctor(capsys, monkeypatch, HOSTS / "strix-good")
    assert code == 0, out
    assert lines(out, "kernel")[0] == "[ok  ] kernel: 6.18.6-200.fc43.x86_64 (>= 6.18.4)"
    assert lines(out, "gpu memory")[0].startswith("[ok  ] gpu memory: BIOS carve-out (VRAM) 0.5 GiB, GTT 96.0 GiB")
    assert "set by ttm.pages_limit" in out
    assert lines(out, "MES firmware")[0] == "[ok  ] MES firmware: card1: MES 0x80"
    assert "fix:" not in out and out.endswith("doctor: host GPU checks passed\n")


def test_bad_strix_halo_host_fails_each_check_with_its_fix(capsys, monkeypatch):
    code, out = doctor(capsys, monkeypatch, HOSTS / "strix-bad")
    assert code == 1, out
    kernel = lines(out, "kernel")
    assert kernel[0].startswith("[FAIL] kernel: 6.17.9-300.fc43.x86_64: older than 6.18.4")
    assert kernel[1].startswith("       fix: boot a kernel >= 6.18.4") and "20251125" in kernel[1]
    memory = lines(out, "gpu memory")
    assert memory[0].startswith("[FAIL] gpu memory: BIOS carve-out (VRAM) 64.0 GiB")
    assert "ROCm sees only the BIOS carve-out" in memory[0]
    assert "ttm.pages_limit=25165824" in memory[1] and "reboot" in memory[1]
    mes = lines(out, "MES firmware")
    assert mes[0].startswith("[FAIL] MES firmware: card1: MES 0x83") and "#5724" in mes[0]
    assert "MES 0x80" in mes[1]
    assert out.endswith("doctor: host GPU problems found (see fix: lines)\n")


def test_bad_host_json(capsys, monkeypatch):
    code, out = doctor(capsys, monkeypatch, HOSTS / "strix-bad", "--json")
    data = json.loads(out)
    assert code == 1 and data["ok"] is False
    failed = {c["name"] for c in data["checks"] if c["status"] == "fail"}
    assert failed == {"kernel", "gpu memory", "MES firmware"}
    assert all(c["hint"] for c in data["checks"] if c["status"] == "fail")


def test_other_gpu_gets_no_strix_halo_verdicts(capsys, monkeypatch):
    # kernel 6.8 and MES 0x83 on a gfx1100: not this project's records to judge
    code, out = doctor(capsys, monkeypatch, HOSTS / "radeon-gfx1100")
    assert code == 0, out
    assert "[info] strix halo: no gfx1151 GPU in sysfs (card0 0x744c gfx target 110000)" in out
    assert "kernel:" not in out and "MES" not in out and "gpu memory" not in out


def test_no_gpu_at_all(capsys, monkeypatch, tmp_path):
    code, out = doctor(capsys, monkeypatch, tmp_path)
    assert code == 1
    assert lines(out, "/dev/kfd")[0] == "[FAIL] /dev/kfd: missing: no ROCm compute device"
    assert "modprobe amdgpu" in lines(out, "/dev/kfd")[1]
    assert lines(out, "/dev/dri")[0].startswith("[FAIL] /dev/dri: no render node")
    assert "[info] strix halo: no gfx1151 GPU in sysfs (no AMD GPU)" in out


def copy(name: str, tmp_path: Path) -> Path:
    dst = tmp_path / name
    shutil.copytree(HOSTS / name, dst)
    return dst


@pytest.mark.parametrize("release, status", [("6.18.3-arch1-1", "fail"), ("6.18.4-arch1-1", "ok"),
                                             ("6.19.0", "ok"), ("7.1.0", "ok"), ("6.17.99", "fail"),
                                             ("weird", "info")])
def test_kernel_threshold(tmp_path, release, status):
    tree = copy("strix-good", tmp_path)
    (tree / "proc/sys/kernel/osrelease").write_text(release + "\n")
    assert gpuhost.kernel_check(tree).status == status


# AMD's Strix Halo page accepts Ubuntu 24.04 HWE >= 6.17.0-19.19~24.04.2 and OEM >= 6.14.0-1018 below 6.18.4.
@pytest.mark.parametrize("release, signature, status", [
    ("6.17.0-19-generic", "Ubuntu 6.17.0-19.19~24.04.2-generic 6.17.13", "ok"),
    ("6.17.0-35-generic", "Ubuntu 6.17.0-35.35~24.04.1-generic 6.17.13", "ok"),
    ("6.17.0-14-generic", "Ubuntu 6.17.0-14.14~24.04.1-generic 6.17.9", "fail"),
    ("6.17.0-19-generic", None, "ok"),   # no version_signature: uname's ABI alone
    ("6.17.0-14-generic", None, "fail"),
    ("6.14.0-1018-oem", "Ubuntu 6.14.0-1018.18-oem 6.14.0", "ok"),
    ("6.14.0-1017-oem", "Ubuntu 6.14.0-1017.17-oem 6.14.0", "fail"),
    ("6.8.0-90-generic", "Ubuntu 6.8.0-90.91-generic 6.8.12", "fail"),
    ("6.17.9-300.fc43.x86_64", None, "fail"),  # not Ubuntu's: 6.18.4 as elsewhere
])
def test_ubuntu_kernels_amd_accepts(tmp_path, release, signature, status):
    tree = copy("strix-good", tmp_path)
    (tree / "proc/sys/kernel/osrelease").write_text(release + "\n")
    if signature:
        (tree / "proc/version_signature").write_text(signature + "\n")
    c = gpuhost.kernel_check(tree)
    assert c.status == status, c
    if status == "fail" and "fc43" not in release:
        assert "6.17.0-19.19~24.04.2" in c.hint


@pytest.mark.parametrize("text, status", [("0x00000083", "fail"), ("0x00000080", "ok"), ("0x00000086", "ok"),
                                          (None, "info"), ("garbage", "info")])
def test_mes_versions(tmp_path, text, status):
    tree = copy("strix-good", tmp_path)
    f = tree / "sys/class/drm/card1/device/fw_version/mes_fw_version"
    if text is None:
        f.unlink()
    else:
        f.write_text(text + "\n")
    [gpu] = gpuhost.amd_gpus(tree)
    assert gpuhost.mes_check(gpu).status == status


def test_memory_setting_in_modprobe_conf_counts_only_when_in_effect(tmp_path):
    tree = copy("strix-bad", tmp_path)
    [gpu] = gpuhost.amd_gpus(tree)
    (tree / "etc/modprobe.d").mkdir(parents=True)
    (tree / "etc/modprobe.d/ttm.conf").write_text("options ttm pages_limit=25165824 page_pool_size=25165824\n")
    c = gpuhost.memory_check(tree, gpu)
    assert c.status == "fail" and "not in effect" in c.detail and "initramfs" in c.hint
    (tree / "sys/module/ttm/parameters/pages_limit").write_text("25165824\n")  # after the reboot
    c = gpuhost.memory_check(tree, gpu)
    assert c.status == "ok" and "in /etc/modprobe.d/ttm.conf" in c.detail
    # the older knob, amdgpu's gttsize (MiB), counts where the live TTM limit is unreadable...
    tree2 = copy("strix-bad", tmp_path / "b")
    (tree2 / "sys/module/amdgpu/parameters/gttsize").write_text("98304\n")
    (tree2 / "sys/module/ttm/parameters/pages_limit").unlink()
    assert gpuhost.memory_check(tree2, gpu).status == "ok"
    # ...not where the live limit is still the RAM/2 default: deprecated, it raises nothing (unsloth #7878)
    (tree2 / "sys/module/ttm/parameters/pages_limit").write_text("7936000\n")  # 30.3 GiB of 62 GiB
    c = gpuhost.memory_check(tree2, gpu)
    assert c.status == "fail" and "RAM/2 default" in c.detail and "amdgpu gttsize=98304 does not raise it" in c.detail
    assert "ttm.pages_limit=" in c.hint and "#7878" in c.hint


def test_gfx1151_found_by_pci_id_without_kfd_topology(tmp_path):
    tree = copy("strix-bad", tmp_path)
    shutil.rmtree(tree / "sys/class/kfd")
    [gpu] = gpuhost.amd_gpus(tree)
    assert gpu.is_gfx1151 and gpu.gfx_target is None
    tree = copy("radeon-gfx1100", tmp_path / "r")
    shutil.rmtree(tree / "sys/class/kfd")
    assert not gpuhost.amd_gpus(tree)[0].is_gfx1151


@pytest.mark.skipif(os.geteuid() != 0, reason="giving the device node another owner needs root")
def test_device_access_names_the_group_to_join(tmp_path):
    tree = copy("strix-good", tmp_path)
    node = tree / "dev/dri/renderD128"
    other = 65534
    os.chown(node, other, other)
    node.chmod(0o660)
    group = grp.getgrgid(other).gr_name
    checks = {c.name: c for c in gpuhost.device_checks(tree, uid=1000, gids={1000})}
    c = checks["/dev/dri/renderD128"]
    assert c.status == "fail" and c.detail == f"no read/write access (group {group})"
    assert c.hint == f"sudo usermod -aG {group} $USER, then log in again"
    assert gpuhost.device_checks(tree, uid=1000, gids={1000, other})[1].status == "ok"
    node.chmod(0o666)  # world read/write (some distros' udev rule for /dev/kfd)
    assert gpuhost.device_checks(tree, uid=1000, gids={1000})[1].status == "ok"


def test_in_image_attention_kernels_check_on_gfx1151_only():
    from toolbox_train.commands.health import AOTRITON_ENV, aotriton_check

    assert aotriton_check("gfx1151", {AOTRITON_ENV: "1"}).status == "ok"
    for env in ({}, {AOTRITON_ENV: "0"}):
        c = aotriton_check("gfx1151", env)
        assert c.status == "fail" and "#6034" in c.detail and c.hint.startswith(f"export {AOTRITON_ENV}=1")
    assert aotriton_check("gfx1100", {}) is None  # not this record's arch
