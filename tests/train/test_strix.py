"""planning/strix.py: what Strix Halo (gfx1151) users report breaking, caught before the first step,
each on stand-in devices (what torch would report there) good and bad, and through the real hooks:
the memory plan's refusal, the TrainingArguments, the resolved run's checks, the trainer's NaN stop."""

from __future__ import annotations

import dataclasses

import pytest
import yaml

from toolbox_train import bench
from toolbox_train.contract import UserError
from toolbox_train.planning import memory, strix
from toolbox_train.planning.strix import Device

GiB = 1 << 30
RAM_128GB = 128_000_000_000 - 3 * GiB  # MemTotal of a 128 GB machine, less what firmware keeps
HALO_DEFAULT = Device("gfx1151:xnack-", "7.15.26333", int(62.47 * GiB), RAM_128GB)  # unsloth #7878's report
HALO_RAISED = Device("gfx1151:xnack-", "7.15.26333", 96 * GiB, RAM_128GB)  # ttm.pages_limit=25165824
RADEON = Device("gfx1100", "7.15.26333", 24 * GiB, 64 * GiB)
CPU = Device()


def test_half_the_memory_names_the_ttm_setting_and_its_fix():
    hint = strix.memory_hint(HALO_DEFAULT)
    assert "62.47 GiB" in hint and "ttm.pages_limit=" in hint and "#7878" in hint
    pages = int(hint.split("ttm.pages_limit=")[1].split()[0])
    assert pages % strix.PAGES_PER_GIB == 0 and 80 * GiB < pages * 4096 < RAM_128GB
    for dev in (HALO_RAISED, RADEON, CPU):
        assert strix.memory_hint(dev) is None
    assert strix.memory_refusal(None, HALO_DEFAULT) is None  # a plan that fits needs no hint
    assert strix.memory_refusal("x does not fit", HALO_RAISED) == "x does not fit"


def _tiny_config(tmp_path, **model):
    path = tmp_path / "model"
    bench.build_model_dir("tiny-llama", path)
    data = bench.write_text_dataset(tmp_path / "data.jsonl", 8, 80, 500)
    cfg = {"model": {"path": str(path), **model}, "data": {"path": str(data), "format": "text", "max_seq_length": 64},
           "method": "full", "train": {"per_device_batch_size": 2, "max_steps": 1},
           "output": {"dir": str(tmp_path / "out"), "progress_bar": False}}
    p = tmp_path / "train.yaml"
    p.write_text(yaml.safe_dump(cfg))
    return p


@pytest.mark.parametrize("dev, named", [(HALO_DEFAULT, True), (HALO_RAISED, False)])
def test_the_memory_plan_refusal_names_ttm_where_torch_sees_half(tmp_path, monkeypatch, dev, named):
    from toolbox_train.planning.run import resolve

    # what torch reports on that machine: free memory too small for the plan, and the device itself
    monkeypatch.setattr(memory, "device_memory", lambda override=None, local_rank=0: 1 << 20)
    monkeypatch.setattr(strix, "device", lambda local_rank=0: dev)
    with pytest.raises(UserError) as exc:
        resolve(_tiny_config(tmp_path), ["backend=hf"], check_output=False, gpu=True)
    assert "memory: predicted peak" in str(exc.value)
    assert ("ttm.pages_limit=" in str(exc.value)) is named


@pytest.mark.parametrize("workers, gpu, dev, want", [
    ("auto", True, HALO_DEFAULT, (0, False)),   # halo-forge HARDWARE_NOTES: 0 workers, no pinned memory
    ("auto", True, RADEON, (1, True)),
    ("auto", False, CPU, (0, False)),
    (2, True, HALO_DEFAULT, (2, False)),        # a number is the user's; pinning stays off on the APU
])
def test_dataloader_on_the_unified_memory_apu(workers, gpu, dev, want):
    assert strix.loader(workers, gpu, dev) == want


def test_training_arguments_take_the_loader_settings(tmp_path, monkeypatch):
    from toolbox_train.planning.run import Dist, resolve
    from toolbox_train.training.arguments import common_args

    p = resolve(_tiny_config(tmp_path), check_output=False, probe_device=False)
    p = dataclasses.replace(p, gpu=True)  # resolved as on the GPU: what the arguments say there
    monkeypatch.setattr(strix, "device", lambda local_rank=0: HALO_DEFAULT)
    a = common_args(p, Dist())
    assert a["dataloader_num_workers"] == 0 and a["dataloader_pin_memory"] is False
    assert a["accelerator_config"] == {"non_blocking": False}  # nothing pinned: a non-blocking copy gains nothing
    monkeypatch.setattr(strix, "device", lambda local_rank=0: RADEON)
    a = common_args(p, Dist())
    assert a["dataloader_num_workers"] == 1 and a["dataloader_pin_memory"] is True
    # pinned: accelerate copies each batch to the GPU without blocking the host (issue 44)
    assert a["accelerator_config"] == {"non_blocking": True}
    from transformers import TrainingArguments

    args = TrainingArguments(**{**a, "use_cpu": True, "bf16": False, "report_to": [], "output_dir": str(tmp_path / "o")})
    assert args.accelerator_config.non_blocking is True


def test_attention_on_gfx1151():
    assert strix.attention(None, "bf16", HALO_RAISED) is None  # transformers' default: sdpa, or eager (GPT-OSS)
    assert strix.attention("eager", "bf16", HALO_RAISED) == "eager"
    with pytest.raises(UserError, match="flash_attention_2 in bf16 gives NaN losses on gfx1151.*fix: model.attn_implementation: sdpa"):
        strix.attention("flash_attention_2", "bf16", HALO_RAISED)
    assert strix.attention("flash_attention_2", "fp16", HALO_RAISED) == "flash_attention_2"
    assert strix.attention("flash_attention_2", "bf16", RADEON) == "flash_attention_2"  # not this record's arch
    assert strix.attention(None, "bf16", CPU) is None


def test_a_nan_at_the_first_step_names_the_attention():
    hint = strix.nan_hint(1, "sdpa", HALO_RAISED)
    assert "sdpa" in hint and "#3385" in hint and "model.attn_implementation: eager" in hint
    assert strix.nan_hint(40, "sdpa", HALO_RAISED) is None and strix.nan_hint(1, "sdpa", RADEON) is None


MOE = {"model_type": "gpt_oss", "num_local_experts": 32, "hidden_size": 64}


@pytest.mark.parametrize("hip, bad", [("7.2.0", True),  # torch 2.10.0+rocm7.12.0 (TheRock #5284)
                                      ("7.13.99004", False), ("7.15.26333", False), (None, False)])
def test_moe_on_a_hip_whose_grouped_mm_crashes(hip, bad):
    dev = Device("gfx1151", hip, 96 * GiB, RAM_128GB)
    why = strix.moe_problem(MOE, dev)
    assert (why is not None) is bad
    if bad:
        assert "32 experts" in why and "torch._grouped_mm" in why and "#5284" in why and "fix:" in why
    assert strix.moe_problem({"model_type": "llama", "hidden_size": 64}, dev) is None  # dense: no grouped_mm


def test_the_resolved_run_refuses_bf16_flash_attention_and_the_moe(tmp_path):
    from toolbox_train.planning.run import resolve

    p = resolve(_tiny_config(tmp_path), check_output=False, probe_device=False)
    p = dataclasses.replace(p, gpu=True, precision="bf16")  # as resolved on the GPU
    strix.preflight(p, HALO_RAISED)
    assert p.cfg.model.attn_implementation is None
    flash = p.cfg.model.model_copy(update={"attn_implementation": "flash_attention_2"})
    with pytest.raises(UserError, match="flash_attention_2 in bf16"):
        strix.preflight(dataclasses.replace(p, cfg=p.cfg.model_copy(update={"model": flash})), HALO_RAISED)
    with pytest.raises(UserError, match="grouped_mm"):
        strix.preflight(dataclasses.replace(p, model_config=MOE), Device("gfx1151", "7.2.0", 96 * GiB, RAM_128GB))


def test_resolve_runs_the_checks_on_this_ranks_gpu(tmp_path, monkeypatch):
    # resolve on a GPU (finetune's ranks) asks strix; launch's parent (probe_device False) touches no GPU
    from toolbox_train.planning.run import resolve

    monkeypatch.setattr(memory, "device_memory", lambda override=None, local_rank=0: 64 * GiB)
    monkeypatch.setattr(memory, "unified_memory", lambda local_rank=0: False)
    monkeypatch.setattr(strix, "device", lambda local_rank=0: HALO_RAISED)
    flash = ["backend=hf", "train.precision=fp32", "model.attn_implementation=flash_attention_2"]
    resolve(_tiny_config(tmp_path), flash, check_output=False, gpu=True)  # fp32: not the record's case
    from toolbox_train.planning import run

    monkeypatch.setattr(run, "resolve_precision", lambda cfg, gpu, machine: "bf16")
    with pytest.raises(UserError, match="model.attn_implementation: flash_attention_2 in bf16"):
        resolve(_tiny_config(tmp_path), flash, check_output=False, gpu=True)
    resolve(_tiny_config(tmp_path), flash, check_output=False, gpu=True, probe_device=False)
