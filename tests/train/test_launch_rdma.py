"""`launch --dry-run --transport rdma` prints the RDMA settings it resolved, with their reasons:
per GPU (gfx1151 differs) and per NIC (device, port and GID entry from a fake sysfs tree), and a
value already in the environment wins."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from helpers.fake_sysfs import irdma
from helpers.tiny import write_dataset, write_train_config

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow
KEYS = ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME", "NCCL_IB_DISABLE", "NCCL_IB_GID_INDEX", "NCCL_IB_HCA",
        "NCCL_NET_GDR_LEVEL", "NCCL_IB_TIMEOUT", "NCCL_IB_RETRY_CNT")


def dry_run(tmp_path, tiny_model, **env_over):
    out = tmp_path / "out"
    data = write_dataset(tmp_path / "d.jsonl", "text", n=16)
    cfg = write_train_config(tmp_path / "train.yaml", tiny_model, data, out, **{"train.max_steps": 2})
    env = {k: v for k, v in os.environ.items() if k not in KEYS}
    env.update(PYTHONPATH=str(ROOT / "entrypoints"), **env_over)
    r = subprocess.run([sys.executable, "-m", "toolbox_train.commands.launch", "--strategy", "ddp", "--cpu", "--nproc", "1",
                        "--nnodes", "2", "--node-rank", "1", "--master-addr", "127.0.0.1", "--master-port", "29511",
                        "--transport", "rdma", "--dry-run", "--", "finetune", "--config", str(cfg)],
                       cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    return r.stderr, json.loads((out / "launch" / "settings.node1.json").read_text())


def test_gfx1151_rdma_settings_and_reasons(tmp_path, tiny_model):
    sysfs = tmp_path / "sysroot"
    irdma(sysfs, "lo", "127.0.0.1")  # the interface that routes to the master here is lo
    text, saved = dry_run(tmp_path, tiny_model, TOOLBOX_SYSFS_ROOT=str(sysfs), TOOLBOX_GPU_ARCH="gfx1151")
    assert "  rdma:\n" in text
    assert "    NCCL_NET_GDR_LEVEL=0  # gfx1151 has no GPUDirect RDMA" in text
    assert "    NCCL_IB_HCA==irdma0:1  # exactly one device, port irdma0:1 (its GID 1 is RoCE v2 for 127.0.0.1 on lo)" in text
    assert "    NCCL_IB_GID_INDEX=1  # from irdma0:1's GID table: entry 1 = 0000:0000:0000:0000:0000:ffff:7f00:0001" in text
    assert "    NCCL_IB_TIMEOUT=23  #" in text and "    NCCL_IB_RETRY_CNT=7  #" in text
    assert saved["env"]["NCCL_IB_HCA"] == "=irdma0:1" and saved["env"]["NCCL_NET_GDR_LEVEL"] == "0"
    assert saved["rdma"]["NCCL_IB_GID_INDEX"].startswith("1  # from irdma0:1's GID table")


def test_environment_wins_and_other_gpus_keep_gdr(tmp_path, tiny_model):
    sysfs = tmp_path / "sysroot"
    irdma(sysfs, "lo", "127.0.0.1")
    text, saved = dry_run(tmp_path, tiny_model, TOOLBOX_SYSFS_ROOT=str(sysfs), TOOLBOX_GPU_ARCH="gfx1151",
                          NCCL_IB_GID_INDEX="5", NCCL_IB_HCA="=mlx5_2:1")
    assert "    NCCL_IB_GID_INDEX=5  # from the environment (launch would set 1: from irdma0:1's GID table" in text
    assert saved["env"]["NCCL_IB_GID_INDEX"] == "5" and saved["env"]["NCCL_IB_HCA"] == "=mlx5_2:1"
    # No RDMA device and not a gfx1151: no GDR override, no HCA (said why), the mlx5-style GID.
    text, saved = dry_run(tmp_path, tiny_model, TOOLBOX_SYSFS_ROOT=str(tmp_path / "empty"), TOOLBOX_GPU_ARCH="gfx942")
    assert "NCCL_NET_GDR_LEVEL" not in saved["env"] and "NCCL_IB_HCA" not in saved["env"]
    assert "    NCCL_IB_HCA=(unset)  # not set: no RDMA device under /sys/class/infiniband" in text
    assert saved["env"]["NCCL_IB_GID_INDEX"] == "3"
