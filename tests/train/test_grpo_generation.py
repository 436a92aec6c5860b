"""`grpo.generation: vllm-colocate` (issue 32) refused before any model loads where it cannot run:
vLLM not installed (this venv has none), the installed vLLM pinned to another torch, the CPU. One
line naming the field, exit 2, nothing written. The installed vLLM is read from its own metadata
(importlib.metadata), so a `vllm-X.dist-info` on sys.path is what an installed vLLM looks like to
the check; no vLLM code is faked."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

import pytest
from packaging.version import Version

from helpers import pref
from helpers.tiny import write_train_config
from test_objectives_data import NO_OUTPUT, _refused
from toolbox_train.planning.run import pick_backend
from toolbox_train.commands import finetune
from toolbox_train.config.schema import TrainConfig
from toolbox_train.generation import sampler as generation
from toolbox_train.generation.trainer import trl_kwargs

GRPO = {"objective": "grpo", "grpo.num_generations": 4, "train.per_device_batch_size": 4,
        "grpo.rewards": [{"function": "length", "max_chars": 9}], "grpo.generation": "vllm-colocate"}
TORCH = Version(version("torch")).base_version


def _installed_vllm(monkeypatch, tmp_path, vllm: str, torch_pin: str):
    """vLLM's dist-info as pip leaves it (METADATA with its torch requirement), on sys.path."""
    d = tmp_path / "site" / f"vllm-{vllm}.dist-info"
    d.mkdir(parents=True)
    d.joinpath("METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm\nVersion: {vllm}\n"
                                      f"Requires-Dist: torch=={torch_pin}\nRequires-Dist: transformers>=5.10.4\n")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    assert version("vllm") == vllm


def test_without_vllm_installed(tmp_path, tiny_model, capsys):
    with pytest.raises(PackageNotFoundError):
        version("vllm")  # the test's premise: CI's venv has no vLLM
    prompts = pref.write(tmp_path / "g.jsonl", "prompt", 8)
    _refused(capsys, tmp_path, tiny_model, prompts,
             ["grpo.generation: vllm-colocate needs vLLM, which is not installed", "vllm==0.31.0"], **GRPO)


def test_vllm_pinned_to_another_torch(tmp_path, tiny_model, capsys, monkeypatch):
    other = "2.14.0" if TORCH != "2.14.0" else "2.13.0"  # vLLM 0.33/0.34 pin torch 2.14.0
    _installed_vllm(monkeypatch, tmp_path, "0.34.0", other)
    prompts = pref.write(tmp_path / "g.jsonl", "prompt", 8)
    _refused(capsys, tmp_path, tiny_model, prompts,
             [f"grpo.generation: vllm-colocate: vLLM 0.34.0 requires torch=={other}, the installed torch is "
              f"{version('torch')}"], **GRPO)


def test_vllm_matching_torch_on_the_cpu(tmp_path, tiny_model, capsys, monkeypatch):
    """The packages agree (a vLLM pinned to this torch), so the machine decides: no CUDA GPU here."""
    _installed_vllm(monkeypatch, tmp_path, "0.32.0", TORCH)
    prompts = pref.write(tmp_path / "g.jsonl", "prompt", 8)
    _refused(capsys, tmp_path, tiny_model, prompts,
             ["grpo.generation: vllm-colocate generates on a CUDA GPU and this run is on the CPU"], **GRPO)


def test_unsloth_backend_and_the_config_rules(tmp_path, tiny_model, capsys, monkeypatch):
    _installed_vllm(monkeypatch, tmp_path, "0.31.0", TORCH)
    base = {"model": {"path": "m"}, "data": {"path": "d.jsonl"}, "output": {"dir": "o"}, "objective": "grpo"}
    cfg = TrainConfig.model_validate({**base, "grpo": {"generation": "vllm-colocate"}})
    assert "backend is unsloth" in generation.refusal(cfg.grpo, "grpo.generation", "unsloth", gpu=True)
    plain = TrainConfig.model_validate(base)
    assert plain.grpo.generation == "auto" and generation.refusal(plain.grpo, "grpo.generation", "hf", gpu=False) is None
    assert trl_kwargs(plain.grpo, "transformers") == {"use_vllm": False}
    # backend auto: Unsloth for GRPO where it is (planning for a toolbox image: `machine`: its own path
    # measured faster and leaner than hf's static sampler, H100), hf for the vLLM mode (TRL's own)
    assert pick_backend(plain, gpu=True, fsdp=False, machine="image") == "unsloth"
    assert pick_backend(cfg, gpu=True, fsdp=False, machine="image") == "hf"
    assert pick_backend(plain.model_copy(update={"objective": "sft"}), gpu=True, fsdp=False, machine="image") == "unsloth"
    vcfg = TrainConfig.model_validate({**base, "grpo": {"generation": "vllm-colocate",
                                                        "vllm_gpu_memory_utilization": 0.4}})
    assert trl_kwargs(vcfg.grpo, "vllm-colocate") == {"use_vllm": True, "vllm_mode": "colocate",
                                                "vllm_gpu_memory_utilization": 0.4}
    # the share of GPU memory belongs to the vLLM mode; an unknown mode is a config error
    prompts = pref.write(tmp_path / "g.jsonl", "prompt", 8)
    for over, msg in (({"grpo.vllm_gpu_memory_utilization": 0.4}, "belongs to generation: vllm-colocate"),
                      ({"grpo.generation": "vllm-server"}, "grpo.generation")):
        cfg_path = write_train_config(tmp_path / "t.yaml", tiny_model, prompts, tmp_path / "out",
                                      **{**GRPO, "grpo.generation": "transformers", **over})
        assert finetune.main(["--config", str(cfg_path)]) == 2
        err = capsys.readouterr().err
        assert msg in err and "Traceback" not in err, err
        assert not (tmp_path / "out").exists(), NO_OUTPUT
