"""`launch`: real multi-process DDP on CPU (gloo) through accelerate/torchrun, two "nodes" on
loopback with c10d and LocalSGD, and the generated configs and environment."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from helpers.tiny import write_dataset, write_train_config
from toolbox_train.commands import launch

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow


def _launch_cmd():
    exe = Path(sys.executable).with_name("launch")
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "toolbox_train.commands.launch"]


def _env():
    env = {**os.environ, "PYTHONPATH": str(ROOT / "entrypoints"), "OMP_NUM_THREADS": "1"}
    for k in ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME", "NCCL_IB_DISABLE", "WORLD_SIZE", "RANK", "LOCAL_RANK"):
        env.pop(k, None)
    return env


def _metrics(out):
    return [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _cfg(tmp_path, model, out, **over):
    data = write_dataset(tmp_path / "d.jsonl", "text", n=64)
    base = {"train.max_steps": 6, "train.per_device_batch_size": 2, "train.batch_size": 8,
            "output.save_steps": 3}
    base.update(over)
    return write_train_config(tmp_path / "train.yaml", model, data, out, **base)


def test_ddp_two_cpu_processes(tmp_path, tiny_model):
    out = tmp_path / "out"
    cfg = _cfg(tmp_path, tiny_model, out)
    r = subprocess.run([*_launch_cmd(), "--strategy", "ddp", "--nproc", "2", "--cpu", "--",
                        "finetune", "--config", str(cfg), "--json"], capture_output=True, text=True,
                       timeout=400, env={**_env(), "TOOLBOX_COUNT_GRAD_ALLREDUCE": "1"})
    assert r.returncode == 0, r.stderr[-4000:]
    assert "launch: resolved settings" in r.stderr and "world_size: 2" in r.stderr
    summary = json.loads(r.stdout.strip().splitlines()[-1])
    digests = summary["rank_weight_sha256"]
    assert len(digests) == 2 and digests[0] == digests[1]  # both ranks hold identical weights
    # 6 optimizer steps x 2 micro-steps: the gradient all-reduce runs on the last micro-step only
    # (the tiny model's gradients fit in one DDP bucket).
    assert summary["grad_allreduce_calls"] == 6
    m = _metrics(out)
    assert [x["step"] for x in m] == list(range(1, 7))  # rank 0 alone logs
    assert m[-1]["loss"] < m[0]["loss"]
    resolved = yaml.safe_load((out / "config.resolved.yaml").read_text())["_resolved"]
    assert resolved["world_size"] == 2 and resolved["gradient_accumulation_steps"] == 2
    # The exact accelerate config used is kept with the results and parses with accelerate.
    from accelerate.commands.config.config_args import ClusterConfig

    acc = ClusterConfig.from_yaml_file(str(out / "launch" / "accelerate.node0.yaml"))
    assert acc.num_processes == 2 and acc.num_machines == 1
    assert [p.name for p in (out / "checkpoints").iterdir() if p.name.startswith("checkpoint-")]


def _two_nodes(tmp_path, model, extra_env=None, resume=False):
    port = str(_free_port())
    procs = []
    for rank in (0, 1):  # separate output folders, as on two machines with their own disks
        cfgn = write_train_config(tmp_path / f"n{rank}.yaml", model, tmp_path / "d.jsonl",
                                  tmp_path / f"node{rank}", **{"train.max_steps": 4, "train.per_device_batch_size": 2,
                                                              "train.batch_size": 8, "output.save_steps": 2})
        procs.append(subprocess.Popen(
            [*_launch_cmd(), "--strategy", "ddp", "--nproc", "1", "--cpu", "--nnodes", "2", "--node-rank",
             str(rank), "--master-addr", "127.0.0.1", "--master-port", port, "--sync", "local-sgd:2",
             "--max-restarts", "0", "--", "finetune", "--config", str(cfgn), "--json", *(["--resume"] if resume else [])],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env={**_env(), "TOOLBOX_COUNT_GRAD_ALLREDUCE": "1", **(extra_env or {})}))
    results = [p.communicate(timeout=400) for p in procs]
    for p, (so, se) in zip(procs, results):
        assert p.returncode == 0, se[-4000:]
    return results


def test_two_nodes_on_loopback_c10d_local_sgd_and_resume(tmp_path, tiny_model):
    write_dataset(tmp_path / "d.jsonl", "text", n=64)
    # Stopped after step 2 on both nodes, then resumed: each node resumes from its own checkpoint.
    _two_nodes(tmp_path, tiny_model, {"TOOLBOX_STOP_AFTER_STEP": "2"})
    cp1 = tmp_path / "node1" / "checkpoints" / "checkpoint-2"
    assert (cp1 / "rng_state_1.pth").exists() and (cp1 / "trainer_state.json").exists()  # node 1's own copy
    results = _two_nodes(tmp_path, tiny_model, resume=True)
    err0 = results[0][1]
    assert "rendezvous: c10d" in err0 and "'GLOO_SOCKET_IFNAME': 'lo'" in err0
    assert "'NCCL_IB_DISABLE': '1'" in err0 and "sync: local-sgd:2" in err0
    assert "resuming from" in err0 and "checkpoint-2" in err0
    summary = json.loads(results[0][0].strip().splitlines()[-1])
    assert summary["steps"] == 4
    d = summary["rank_weight_sha256"]
    assert len(d) == 2 and d[0] == d[1]  # LocalSGD's final average leaves both nodes equal
    assert summary["grad_allreduce_calls"] == 0  # parameters averaged instead of gradients
    assert "LocalSGD: averaging parameters every 2 optimizer steps" in err0
    assert [m["step"] for m in _metrics(tmp_path / "node0")] == [1, 2, 3, 4]
    settings = json.loads((tmp_path / "node1" / "launch" / "settings.node1.json").read_text())
    assert settings["node_rank"] == 1 and settings["world_size"] == 2
    resolved = yaml.safe_load((tmp_path / "node0" / "config.resolved.yaml").read_text())["_resolved"]
    assert resolved["sync"] == "local-sgd:2" and resolved["gradient_accumulation_steps"] == 2


@pytest.mark.parametrize("arch,layer", [("llama", "LlamaDecoderLayer"), ("qwen3", "Qwen3DecoderLayer"),
                                        ("gemma3-mm", "Gemma3DecoderLayer"), ("gpt-oss", "GptOssDecoderLayer")])
def test_fsdp_config_wraps_the_models_decoder_layer(tmp_path, tiny_models, arch, layer, capsys):
    from accelerate.commands.config.config_args import ClusterConfig

    out = tmp_path / "out"
    cfg = _cfg(tmp_path, tiny_models(arch), out, **{"train.batch_size": 16})
    assert launch.main(["--strategy", "fsdp", "--nproc", "4", "--dry-run", "--", "finetune", "--config",
                        str(cfg)]) == 0
    acc = ClusterConfig.from_yaml_file(str(out / "launch" / "accelerate.node0.yaml"))
    assert acc.distributed_type.value == "FSDP" and acc.num_processes == 4
    wrap = acc.fsdp_config["fsdp_transformer_layer_cls_to_wrap"].split(",")
    assert layer in wrap
    assert acc.fsdp_config["fsdp_version"] == 2
    assert f"fsdp_wrap: {acc.fsdp_config['fsdp_transformer_layer_cls_to_wrap']}" in capsys.readouterr().err


def test_rdma_and_ethernet_environment(tmp_path, tiny_model, monkeypatch):
    out = tmp_path / "out"
    cfg = _cfg(tmp_path, tiny_model, out, **{"train.batch_size": 4})
    argv = ["--strategy", "ddp", "--nproc", "1", "--cpu", "--nnodes", "2", "--node-rank", "1",
            "--master-addr", "127.0.0.1", "--master-port", "29999"]
    for k in ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME", "NCCL_IB_DISABLE", "NCCL_IB_GID_INDEX"):
        monkeypatch.delenv(k, raising=False)
    r = launch.resolve([*argv, "--transport", "rdma", "--", "finetune", "--config", str(cfg)])
    env = r["env"]
    assert env["NCCL_SOCKET_IFNAME"] == env["GLOO_SOCKET_IFNAME"] == "lo"
    assert env["NCCL_IB_DISABLE"] == "0" and env["NCCL_IB_TIMEOUT"] == "23" and env["NCCL_IB_RETRY_CNT"] == "7"
    assert r["accelerate"]["rdzv_backend"] == "c10d" and r["accelerate"]["machine_rank"] == 1
    assert r["accelerate"]["main_process_port"] == 29999
    monkeypatch.setenv("NCCL_IB_GID_INDEX", "1")  # the user's own setting wins
    r = launch.resolve([*argv, "--transport", "rdma", "--ifname", "eth7", "--", "finetune", "--config", str(cfg)])
    assert r["env"]["NCCL_IB_GID_INDEX"] == "1" and r["env"]["GLOO_SOCKET_IFNAME"] == "eth7"
    r = launch.resolve([*argv, "--", "finetune", "--config", str(cfg)])
    assert r["env"]["NCCL_IB_DISABLE"] == "1" and "NCCL_IB_TIMEOUT" not in r["env"]
    assert "--max_restarts" in r["command"] and r["command"][-2:] == ["--config", str(cfg)]


def test_nodes_sharing_an_output_folder_keep_their_own_accelerate_config(tmp_path, tiny_model):
    """A shared (NFS) output folder: each node's config keeps its own machine_rank."""
    from accelerate.commands.config.config_args import ClusterConfig

    out = tmp_path / "shared"
    cfg = _cfg(tmp_path, tiny_model, out)
    for rank in (0, 1):
        assert launch.main(["--strategy", "ddp", "--cpu", "--nproc", "1", "--nnodes", "2", "--node-rank", str(rank),
                            "--master-addr", "127.0.0.1", "--master-port", "29555", "--dry-run", "--",
                            "finetune", "--config", str(cfg)]) == 0
    ranks = [ClusterConfig.from_yaml_file(str(out / "launch" / f"accelerate.node{r}.yaml")).machine_rank for r in (0, 1)]
    assert ranks == [0, 1]


# Rank 1 aborts (SIGABRT, as gloo's threads torn down in finalization do) either at interpreter
# exit, after everything was written, or when it saves its first checkpoint's RNG state: mid run.
ABORT_HOOK = """
import atexit, builtins, os, sys
if os.environ.get("RANK") == "1" and "LOCAL_RANK" in os.environ:
    if os.environ["ABORT_WHEN"] == "at exit":
        atexit.register(os.abort)
    else:
        _import = builtins.__import__
        def _patching_import(*a, **k):
            mod = _import(*a, **k)
            t = getattr(sys.modules.get("transformers.trainer"), "Trainer", None)
            if t is not None and not getattr(t, "_abort_hooked", False):
                t._abort_hooked = True
                t._save_rng_state = lambda self, *a, **k: os.abort()
            return mod
        builtins.__import__ = _patching_import
"""


@pytest.mark.parametrize("when", ["at exit", "mid run"])
def test_a_rank_aborting_after_the_run_finished_is_a_warning_not_a_failure(tmp_path, tiny_model, when):
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(ABORT_HOOK)
    out = tmp_path / "out"
    cfg = _cfg(tmp_path, tiny_model, out, **{"train.max_steps": 4, "output.save_steps": 2})
    env = {**_env(), "ABORT_WHEN": when}
    env["PYTHONPATH"] = os.pathsep.join([str(hook), env["PYTHONPATH"]])
    r = subprocess.run([*_launch_cmd(), "--strategy", "ddp", "--nproc", "2", "--cpu", "--",
                        "finetune", "--config", str(cfg)], capture_output=True, text=True, timeout=400, env=env)
    if when == "at exit":
        assert r.returncode == 0, r.stderr[-4000:]
        assert "launch: warning: a rank ended with exit code" in r.stderr and "nothing was lost" in r.stderr
        assert "SIGABRT" in r.stderr
        assert json.loads((out / "summary.json").read_text())["steps"] == 4
    else:
        assert r.returncode != 0 and "launch: warning" not in r.stderr, r.stderr[-4000:]
        assert "SIGABRT" in r.stderr and (out / "checkpoints").is_dir(), r.stderr[-4000:]
        assert not (out / "summary.json").exists()


def test_ray_workers_get_the_fsdp2_settings_torchrun_ranks_get(tmp_path, tiny_models):
    """launch --launcher ray hands each Ray worker the environment `accelerate launch` gives a rank
    (accelerate's own prepare_multi_gpu_env over the node's accelerate config): for FSDP2, the
    plugin settings transformers' Accelerator reads; torchrun's rendezvous left to Ray."""
    from toolbox_train.commands.ray_train import accelerate_env

    out = tmp_path / "out"
    cfg = _cfg(tmp_path, tiny_models("qwen3"), out, **{"train.batch_size": 16})
    assert launch.main(["--strategy", "fsdp", "--nproc", "4", "--dry-run", "--", "finetune", "--config",
                        str(cfg)]) == 0
    env = accelerate_env(out / "launch" / "accelerate.node0.yaml")
    assert env["ACCELERATE_USE_FSDP"] == "true" and env["FSDP_VERSION"] == "2"
    assert "Qwen3DecoderLayer" in env["FSDP_TRANSFORMER_CLS_TO_WRAP"].split(",")
    assert env["FSDP_AUTO_WRAP_POLICY"] == "TRANSFORMER_BASED_WRAP"
    assert not {"MASTER_ADDR", "MASTER_PORT", "PYTHONPATH"} & env.keys()
