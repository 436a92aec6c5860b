"""issue 26: the host syncs of finetune's training steps, counted on the CPU (helpers/host_syncs.py).

A step between log steps of the default config (backend hf, TRL's fused LM-head path with the torch
stand-in kernel, as on a GPU) may sync only where the model's own forward does: transformers'
SDPA mask building reads `padding_mask.sum() == numel` (masking_utils, `_ignore_causal_mask_sdpa`),
once for a batch without padding and twice with padding, as in the bare loops. TRL's boolean-mask
gather of the labelled positions (a sync in the forward, two index ops, and one in its backward) is
gone by default (`train.lm_head_tokens: all`) and comes back with `labelled`, the same losses and
weights either way.
"""

from __future__ import annotations

import json
from collections import Counter

import pytest

from helpers.host_syncs import step_syncs
from helpers.tiny import train_config, write_dataset

# (op, file) -> per non-log step, for the tiny dataset (padded batches)
ALLOWED = {("item", "transformers/masking_utils.py"): 2}
# at a log step besides: the NaN/inf check (one read of the loss count and the gradient norm together),
# transformers' loss and gradient norm, the deferred token counts (one tolist)
AT_LOG = {("item", "entrypoints/toolbox_train/training/trainer.py"): 1, ("item", "transformers/trainer.py"): 2,
          ("tolist", "entrypoints/toolbox_train/training/step_metrics.py"): 1}
TRL_MASK_GATHER = {("bool-mask index", "trl/trainer/utils.py"): 2,
                   ("bool-mask index_put", "accelerate/accelerator.py"): 1}  # the last: IndexBackward0


def _by_file(syncs) -> Counter:
    return Counter((op, where.split(":")[0]) for op, where in syncs)


def _cfg(tmp_path, tiny_llama, name, method="lora", **extra):
    data = write_dataset(tmp_path / "data.jsonl", "text", 48)
    return train_config(tiny_llama, data, tmp_path / name, method=method,
                        **{"train.max_steps": 6, "output.logging_steps": 3, **extra})


@pytest.fixture
def tiny_llama(tmp_path):
    from helpers.tiny import make_tiny_model

    return make_tiny_model(tmp_path / "model", "llama")


def _non_log(steps):
    got = [s for s in steps if not s["log"]]
    assert [s["step"] for s in got] == [2, 4, 5]  # logs: 1 (logging_first_step), 3 and 6
    return got


def test_non_log_steps_sync_only_in_the_models_mask_and_match_trls_gather(tmp_path, tiny_llama):
    from safetensors.torch import load_file

    steps, summary = step_syncs(_cfg(tmp_path, tiny_llama, "all"))
    for s in _non_log(steps):
        assert _by_file(s["syncs"]) == ALLOWED, s
    assert steps[2]["step"] == 3 and steps[2]["log"]
    assert _by_file(steps[2]["syncs"]) == Counter(ALLOWED) + Counter(AT_LOG), steps[2]

    # TRL's own gather, kept as an option: three more syncs a step, the backward's one among them
    old, old_summary = step_syncs(_cfg(tmp_path, tiny_llama, "labelled", **{"train.lm_head_tokens": "labelled"}))
    for s in _non_log(old):
        assert _by_file(s["syncs"]) == Counter(ALLOWED) + Counter(TRL_MASK_GATHER), s
        assert any("IndexBackward0" in w for _, w in s["syncs"])

    # the same training: losses, gradient norms, tokens and the adapter's weights
    rows = [json.loads(x) for x in (tmp_path / "all" / "metrics.jsonl").read_text().splitlines()]
    old_rows = [json.loads(x) for x in (tmp_path / "labelled" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [r["step"] for r in old_rows] == [1, 3, 6]
    for k in ("loss", "grad_norm"):
        assert [r[k] for r in rows] == pytest.approx([r[k] for r in old_rows], rel=1e-5, abs=1e-7), k
    assert summary["tokens"] == old_summary["tokens"]
    new_w = load_file(tmp_path / "all" / "adapter_model.safetensors")
    old_w = load_file(tmp_path / "labelled" / "adapter_model.safetensors")
    assert new_w.keys() == old_w.keys()
    for k in new_w:
        assert new_w[k].allclose(old_w[k], rtol=1e-4, atol=1e-6), k


def test_full_fine_tune_non_log_steps_sync_only_in_the_models_mask(tmp_path, tiny_llama):
    steps, _ = step_syncs(_cfg(tmp_path, tiny_llama, "full", method="full"))
    for s in _non_log(steps):
        assert _by_file(s["syncs"]) == ALLOWED, s
