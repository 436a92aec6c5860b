"""issue 26: the SFT trainer's per-step metrics read at log steps (output.step_metrics: deferred) log what
TRL's and transformers' own per-step reads log (synced): the same loss, entropy, token accuracy and counts.

TRL's fused LM head is a Triton kernel (GPU only); here a torch stand-in with its inputs and outputs runs
it on the CPU, so both paths go through TRL's fused forward as they do on a GPU.
"""

from __future__ import annotations

import pytest

from toolbox_train import bench


class TorchChunkedLogProb:
    """trl.trainer.utils._ChunkedLogProbFunction's contract, in plain torch (no chunking)."""

    @staticmethod
    def apply(h, w, b, labels, temperature, chunk, softcap, scale, outputs):
        import torch

        logits = (h @ w.T + (0 if b is None else b)).float() * scale
        if softcap:
            logits = softcap * torch.tanh(logits / softcap)
        lp = (logits / temperature).log_softmax(-1)
        log_probs = lp.gather(-1, labels[:, None]).squeeze(-1)
        ent = -(lp.exp() * lp).sum(-1) if "entropy" in outputs else None
        top1 = (logits.argmax(-1) == labels) if "is_top1" in outputs else None
        return log_probs, ent, None, None, top1


def _run(tmp_path, model, data, mode, callbacks):
    from toolbox_train.training import finetune

    cfg = {"model": {"path": str(model)}, "data": {"path": str(data), "format": "text", "max_seq_length": 48},
           "method": "lora", "backend": "hf",
           "train": {"max_steps": 5, "per_device_batch_size": 2, "gradient_checkpointing": False, "seed": 0},
           "output": {"dir": str(tmp_path / mode), "progress_bar": False, "step_metrics": mode, "logging_steps": 2,
                      "save_steps": 3}}
    return finetune.run(cfg, callbacks=callbacks, overwrite=True)


def test_deferred_step_metrics_log_what_trl_logs(tmp_path, monkeypatch):
    import json

    import trl.trainer.utils as trl_utils
    from transformers import TrainerCallback

    from toolbox_train.training import trainer

    monkeypatch.setattr(trl_utils, "_ChunkedLogProbFunction", TorchChunkedLogProb)
    monkeypatch.setattr(trainer, "fused_head_ok", lambda inputs: True)
    model = bench.build_model_dir("tiny-llama", tmp_path / "model")
    data = bench.write_text_dataset(tmp_path / "data.jsonl", 16, 40, 500)

    class Logs(TrainerCallback):
        def __init__(self):
            self.logs = []

        def on_log(self, args, state, control, logs=None, **kw):
            self.logs.append({**logs, "_seen": state.num_input_tokens_seen})

    got = {}
    for mode in ("deferred", "synced"):
        rec = Logs()
        summary = _run(tmp_path, model, data, mode, [rec])
        got[mode] = (rec.logs, summary)
    (d_logs, d_sum), (s_logs, s_sum) = got["deferred"], got["synced"]
    train = [lg for lg in d_logs if "loss" in lg]
    assert len(train) == 3 and all("entropy" in lg and "mean_token_accuracy" in lg for lg in train)  # steps 1, 2, 4
    assert len(d_logs) == len(s_logs)
    for d, s in zip(d_logs, s_logs):
        assert d.keys() == s.keys()
        for k in d:
            if k in ("train_runtime", "train_samples_per_second", "train_steps_per_second",
                     "train_tokens_per_second"):
                continue
            assert d[k] == pytest.approx(s[k], rel=1e-5, abs=1e-6), k
    assert d_sum["tokens"] == s_sum["tokens"] == 5 * 2 * 41  # 40 words and TRL's EOS a row
    # the checkpoint of step 3 (not a log step) holds the tokens of its three steps
    state = json.loads((tmp_path / "deferred" / "checkpoints" / "checkpoint-3" / "trainer_state.json").read_text())
    assert state["num_input_tokens_seen"] == 3 * 2 * 41
