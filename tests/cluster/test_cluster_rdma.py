"""`cluster check --transport rdma` reports, per host, the RDMA device, GID table entry and HCA that
`launch` will use there: the real probe script runs on a fake sysfs root (no RDMA NIC here)."""

from __future__ import annotations

import os
import subprocess

from helpers.fake_sysfs import add_port, irdma, mlx5
from toolbox.cluster.app import rdma_report
from toolbox.cluster.hosts import Host
from toolbox.cluster.probe import PROBE_SCRIPT, parse_probe
from toolbox_train.config import rdma


def probe(root, host: Host):
    # mode none with a trivial Python probe: only the host facts and the sysfs part matter here.
    r = subprocess.run(["sh", "-c", PROBE_SCRIPT, "probe", "none", "", "", "print('python\\t3')"],
                       env={**os.environ, "TOOLBOX_SYSFS_ROOT": str(root)}, capture_output=True, text=True,
                       timeout=60, check=True)
    return parse_probe(host, r.stdout + "addr\tenp194s0np0 192.168.100.1\naddr\tens1 10.0.0.1\n")


def test_probe_reads_the_same_ports_as_launch(tmp_path):
    irdma(tmp_path, "enp194s0np0", "192.168.100.1")
    mlx5(tmp_path, "ens1", "10.0.0.1")
    info = probe(tmp_path, Host("strix1", "strix1", ifname="enp194s0np0"))
    assert info.rdma_ports == rdma.read_ports(str(tmp_path))


def test_report_names_device_gid_entry_and_hca(tmp_path):
    irdma(tmp_path, "enp194s0np0", "192.168.100.1")
    mlx5(tmp_path, "ens1", "10.0.0.1")
    a = probe(tmp_path, Host("strix1", "strix1", ifname="enp194s0np0"))
    b = probe(tmp_path, Host("strix2", "strix2", ifname="ens1"))
    c = probe(tmp_path / "none", Host("strix3", "strix3", ifname="eth0"))
    lines = rdma_report([a, b, c])
    assert lines[0] == ("cluster check: rdma on strix1: device irdma0 port 1 (ACTIVE, Ethernet), "
                        "GID 1 = 0000:0000:0000:0000:0000:ffff:c0a8:6401 (RoCE v2, enp194s0np0); "
                        "NCCL_IB_HCA==irdma0:1 NCCL_IB_GID_INDEX=1 "
                        "(its GID 1 is RoCE v2 for 192.168.100.1 on enp194s0np0)")
    assert "device mlx5_0 port 1" in lines[1] and "NCCL_IB_GID_INDEX=3" in lines[1]
    assert lines[2].startswith("cluster check: rdma on strix3: no RDMA device under /sys/class/infiniband")


def test_report_when_no_port_is_active_or_several_are_ambiguous(tmp_path):
    add_port(tmp_path, "bnxt_re0", 1, state="1: DOWN")
    info = probe(tmp_path, Host("h", "h", ifname="eth0"))
    assert "no ACTIVE RDMA port (bnxt_re0:1 DOWN)" in rdma_report([info])[0]
    irdma(tmp_path, "eth5", "172.16.0.5", device="irdma1")
    mlx5(tmp_path, "eth6", "172.16.0.6")
    info = probe(tmp_path, Host("h", "h", ifname="eth0"))
    assert "several ACTIVE ports (irdma1:1, mlx5_0:1)" in rdma_report([info])[0]


def test_gpu_images_carry_the_verbs_providers():
    from toolbox.components.base import os_packages
    from toolbox.stack.load import load_stack

    fedora = os_packages(load_stack("gfx1151"), "runtime")
    assert {"libibverbs", "libibverbs-utils", "librdmacm"} <= set(fedora)
    debian = os_packages(load_stack("cuda"), "runtime")
    assert {"ibverbs-providers", "libibverbs1", "librdmacm1"} <= set(debian)
    assert not {"ibverbs-providers", "libibverbs1"} & set(os_packages(load_stack("cpu"), "runtime"))
