"""toolbox_train.config.rdma: which RDMA port and GID entry a node uses, read from a fake sysfs tree,
the same through the remote shell probe, and the per-GPU settings with their reasons."""

from __future__ import annotations

import os
import subprocess

from helpers.fake_sysfs import add_port, irdma, mlx5
from toolbox_train.config import rdma


def test_python_reader_and_shell_probe_agree(tmp_path):
    irdma(tmp_path, "enp194s0np0", "192.168.100.1")
    mlx5(tmp_path, "ens1", "10.0.0.1")
    add_port(tmp_path, "mlx5_1", 1, state="1: DOWN")
    out = subprocess.run(["sh", "-c", rdma.SYSFS_PROBE], env={**os.environ, rdma.SYSFS_ROOT_ENV: str(tmp_path)},
                         capture_output=True, text=True, timeout=30, check=True)
    ports = rdma.read_ports(str(tmp_path))
    assert rdma.parse_probe(out.stdout.splitlines()) == ports
    assert [(p.hca, p.state, len(p.gids)) for p in ports] == [("irdma0:1", "ACTIVE", 2), ("mlx5_0:1", "ACTIVE", 4),
                                                             ("mlx5_1:1", "DOWN", 0)]
    assert ports[1].gids[3].type == "RoCE v2" and ports[1].gids[3].ipv4 == "10.0.0.1"


def test_the_port_holding_the_interface_address_and_its_roce_v2_entry(tmp_path):
    irdma(tmp_path, "enp194s0np0", "192.168.100.1")
    mlx5(tmp_path, "ens1", "10.0.0.1")
    ports = rdma.read_ports(str(tmp_path))
    c, _ = rdma.choose(ports, "enp194s0np0", "192.168.100.1")
    assert (c.port.hca, c.gid.index) == ("irdma0:1", 1)
    c, _ = rdma.choose(ports, "ens1", "10.0.0.1")
    assert (c.port.hca, c.gid.index) == ("mlx5_0:1", 3)  # v2, not the v1 entry at 2
    c, why = rdma.choose(ports, "eth9", "172.16.0.1")
    assert c is None and "several ACTIVE ports (irdma0:1, mlx5_0:1)" in why and "set NCCL_IB_HCA" in why


def test_gfx1151_settings_with_reasons(tmp_path):
    irdma(tmp_path, "enp194s0np0", "192.168.100.2")
    got = {s.name: s for s in rdma.settings("gfx1151", rdma.read_ports(str(tmp_path)), "enp194s0np0", "192.168.100.2")}
    assert got["NCCL_NET_GDR_LEVEL"].value == "0" and "GPUDirect" in got["NCCL_NET_GDR_LEVEL"].reason
    assert got["NCCL_IB_HCA"].value == "=irdma0:1" and "ncclCommInitRank" in got["NCCL_IB_HCA"].reason
    assert got["NCCL_IB_GID_INDEX"].value == "1" and "entry 1 = 0000:0000:0000:0000:0000:ffff:c0a8:6402" in \
        got["NCCL_IB_GID_INDEX"].reason
    # Another GPU: no GDR override; no RDMA device at all: no HCA, the GID falls back, both say why.
    other = {s.name: s for s in rdma.settings("gfx942", [], None, None)}
    assert "NCCL_NET_GDR_LEVEL" not in other
    assert other["NCCL_IB_HCA"].value is None and "no RDMA device" in other["NCCL_IB_HCA"].reason
    assert other["NCCL_IB_GID_INDEX"].value == "3"
    assert {s.name: s.value for s in rdma.settings("gfx1151", [], None, None)}["NCCL_IB_GID_INDEX"] == "1"


def test_gpu_arch_from_env_then_image_lock(tmp_path, monkeypatch):
    monkeypatch.setenv(rdma.GPU_ARCH_ENV, "gfx1151")
    assert rdma.detect_gpu_arch() == "gfx1151"
    monkeypatch.delenv(rdma.GPU_ARCH_ENV)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    lock = tmp_path / "stack.lock.yaml"
    lock.write_text("lock_digest: abc\npins:\n  gpu_targets: gfx1151\n  rocm.version: 7.13.0\n")
    monkeypatch.setattr(rdma, "LOCK_FILE", lock)
    assert rdma.detect_gpu_arch() == "gfx1151"
