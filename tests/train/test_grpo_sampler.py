"""GRPO's sampler (issue 41): `grpo.generation: auto` picks the fastest this machine runs (the CPU:
TRL's default generate; a GPU: the static cache with compiled decoding on backend hf, which backend auto
takes for GRPO; backend unsloth set by hand: TRL's default path under Unsloth's patched trainer),
says so in the run's log and in `finetune --plan`, and the static sampler samples from the current
policy: after an optimizer step its completion changes exactly as TRL's default path's does."""

from __future__ import annotations

import pytest

from helpers import pref
from helpers.tiny import train_config, write_train_config
from toolbox_train.commands import finetune
from toolbox_train.config.schema import TrainConfig
from toolbox_train.generation import sampler as generation
from toolbox_train.generation.trainer import trl_kwargs

GRPO = {"objective": "grpo", "method": "full", "train.per_device_batch_size": 4, "grpo.num_generations": 2,
        "grpo.max_completion_length": 8, "data.max_seq_length": 48, "train.max_steps": 1,
        "grpo.rewards": [{"function": "length", "max_chars": 9}]}


def test_auto_picks_by_machine_and_backend_and_maps_onto_trl():
    base = {"model": {"path": "m"}, "data": {"path": "d.jsonl"}, "output": {"dir": "o"}, "objective": "grpo"}
    cfg = TrainConfig.model_validate(base)
    assert cfg.grpo.generation == "auto"
    assert generation.pick(cfg.grpo, "hf", gpu=False)[0] == "transformers"
    # a GPU: the static cache; the compiled loop (issue 46) only where set, until a GPU row measures it
    assert generation.pick(cfg.grpo, "hf", gpu=True)[0] == "transformers-static"
    # backend unsloth: its own generation (the static cache on top measured no faster, H100)
    assert generation.pick(cfg.grpo, "unsloth", gpu=True) == ("transformers", (
        "auto: backend unsloth, its own generation (H100, 2026-12-06: 2.11 s a step, "
        "4.4x TRL's default path on hf)"))
    paged = TrainConfig.model_validate({**base, "grpo": {"generation": "transformers-paged"}})
    assert generation.pick(paged.grpo, "hf", gpu=True) == ("transformers-paged", "set in the config")
    g = cfg.grpo
    assert trl_kwargs(g, "transformers-static") == {"use_vllm": False, "cache_implementation": "static"}
    assert trl_kwargs(g, "transformers-paged") == {"use_vllm": False,
                                                              "use_transformers_continuous_batching": True}
    assert trl_kwargs(g, "transformers") == {"use_vllm": False}
    with pytest.raises(ValueError, match="resolved"):
        trl_kwargs(g, "auto")


def test_plan_says_the_pick_and_its_kv_cache(tmp_path, tiny_model, capsys):
    prompts = pref.write(tmp_path / "g.jsonl", "prompt", 8)
    cfg = write_train_config(tmp_path / "t.yaml", tiny_model, prompts, tmp_path / "out", **GRPO)
    assert finetune.main(["--config", str(cfg), "--plan", "--machine", "h200"]) == 0
    out = capsys.readouterr().out
    # tiny llama: 2 layers x 2 KV heads x head_dim 16; 4 completions x (48 + 8) positions, K and V, bf16
    kv = 4 * (48 + 8) * 2 * 2 * 16 * 2 * 2
    assert "sampler transformers-static (auto: static cache + compiled decoding" in out, out
    assert f"its KV cache {kv / 2**30:.2f} GiB (static: held through the step)" in out, out
    assert "| full hf no ckpt b4 s56 |" in out, out  # the loss reads prompt (48) + completion (8)
    assert finetune.main(["--config", str(cfg), "--plan"]) == 0  # this machine: the CPU
    out = capsys.readouterr().out
    assert "sampler transformers (auto: on the CPU transformers compiles no decoding)" in out, out


def test_kv_cache_of_a_group_that_cannot_fit_is_refused_before_loading(tmp_path, tiny_model, capsys):
    """A long completion for a large group: the sampler's cache alone is over the device's memory."""
    prompts = pref.write(tmp_path / "g.jsonl", "prompt", 8)
    over = {**GRPO, "grpo.num_generations": 64, "train.per_device_batch_size": 64,
            "grpo.max_completion_length": 400_000}
    cfg = write_train_config(tmp_path / "t.yaml", tiny_model, prompts, tmp_path / "out", **over)
    assert finetune.main(["--config", str(cfg), "--plan", "--machine", "h200", "--device-memory", "4GiB"]) == 2
    out = capsys.readouterr().out
    assert "sampler transformers-static" in out and "refused: predicted peak" in out, out
    assert finetune.main(["--config", str(cfg), "--device-memory", "4GiB"]) == 2
    err = capsys.readouterr().err
    assert "memory: predicted peak" in err and "Traceback" not in err, err
    assert not (tmp_path / "out").exists()


def test_the_static_sampler_samples_the_current_weights_as_trls_default_does(tmp_path, tiny_model):
    """One model, a trainer for each sampler; greedy completions of a fixed prompt before and after one
    AdamW step (parameters updated in place, as in training): both samplers agree each time, and the
    step changes what they sample. The static path's forward goes through torch.compile (dynamo, eager
    backend: transformers compiles on the CPU only when told to), which would bake stale weights in if
    it captured them as constants."""
    import torch
    from transformers import CompileConfig

    from toolbox_train.planning import preflight
    from toolbox_train.units import registry
    from toolbox_train.planning.run import Dist, resolve
    from toolbox_train.training import loading

    prompts = pref.write(tmp_path / "g.jsonl", "prompt", 8)
    model = tok = None
    trainers = {}
    for gen in ("transformers", "transformers-static"):
        p = resolve(train_config(tiny_model, prompts, tmp_path / gen, **{**GRPO, "grpo.generation": gen}),
                    check_output=False)
        p, train_ds, _ = preflight.validate(p)
        if model is None:
            model, tok, _ = loading.load(p, Dist())
            tok.pad_token = tok.pad_token or tok.eos_token
        trainers[gen] = t = registry.build(p, Dist(), model, tok, None, train_ds, None, [])
        t.generation_config.do_sample = False  # greedy: the same logits give the same tokens on both paths
    static = trainers["transformers-static"]
    assert static.generation_config.cache_implementation == "static" and not static.generation_config.disable_compile
    assert trainers["transformers"].generation_config.disable_compile  # TRL's default, left as it is
    cc = CompileConfig(backend="eager", mode=None, fullgraph=False)
    cc._compile_all_devices = True
    static.generation_config.compile_config = cc
    ids = tok("w5 w9 w13 w20", add_special_tokens=False)["input_ids"]

    def sample():
        model.train()  # as in training: TRL generates inside training_step
        return {g: t._generate_single_turn([ids, ids[:3]], None, {}, 1)[0] for g, t in trainers.items()}

    before = sample()
    opt = torch.optim.AdamW(model.parameters(), lr=0.05)
    model.train()
    loss = model(input_ids=torch.tensor([ids]), labels=torch.tensor([ids])).loss
    loss.backward()
    opt.step()
    after = sample()
    assert before["transformers-static"] == before["transformers"]
    assert after["transformers-static"] == after["transformers"]
    assert after["transformers"] != before["transformers"]
    assert hasattr(model, "_compiled_call")  # the static path went through torch.compile
