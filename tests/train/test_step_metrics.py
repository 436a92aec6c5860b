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
    from toolbox_train.commands import finetune

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


def test_loss_step_metrics_compute_no_entropy_or_accuracy(tmp_path, monkeypatch):
    """issue 26: `output.step_metrics: loss` (the default) asks TRL's fused head for the log-probabilities
    alone: the kernel is never asked for the entropy or the top-1 accuracy in a training step, neither is
    logged nor in the checkpoint's log history, and the loss and token counts are those of `deferred`.
    Evaluation still runs TRL's compute_loss (its eval_entropy and eval_mean_token_accuracy)."""
    import json

    import trl.trainer.utils as trl_utils
    from transformers import TrainerCallback

    from toolbox_train.training import trainer
    from toolbox_train.config.schema import OutputCfg

    assert OutputCfg(dir=str(tmp_path)).step_metrics == "loss"
    calls = []

    class Recording(TorchChunkedLogProb):
        @staticmethod
        def apply(h, w, b, labels, temperature, chunk, softcap, scale, outputs):
            calls[-1].append(tuple(outputs))
            return TorchChunkedLogProb.apply(h, w, b, labels, temperature, chunk, softcap, scale, outputs)

    monkeypatch.setattr(trl_utils, "_ChunkedLogProbFunction", Recording)
    monkeypatch.setattr(trainer, "fused_head_ok", lambda inputs: True)
    model = bench.build_model_dir("tiny-llama", tmp_path / "model")
    data = bench.write_text_dataset(tmp_path / "data.jsonl", 20, 40, 500)

    class Logs(TrainerCallback):
        def __init__(self):
            self.logs = []
            self.phase = []  # per kernel call: in a training step (True) or an evaluation (False)

        def on_step_begin(self, args, state, control, **kw):
            calls.append([])
            self.phase.append(True)

        def on_log(self, args, state, control, logs=None, **kw):
            self.logs.append(dict(logs))

    from toolbox_train.commands import finetune

    got = {}
    for mode in ("loss", "deferred"):
        calls.clear()
        calls.append([])  # before the first step: none expected
        rec = Logs()
        out = tmp_path / mode
        cfg = {"model": {"path": str(model)}, "data": {"path": str(data), "format": "text", "max_seq_length": 48,
                                                        "eval_split": 0.2},
               "method": "lora", "backend": "hf",
               "train": {"max_steps": 4, "per_device_batch_size": 2, "gradient_checkpointing": False, "seed": 0},
               "output": {"dir": str(out), "progress_bar": False, "logging_steps": 2, "save_steps": 3,
                          "eval_steps": 4}}
        if mode != "loss":
            cfg["output"]["step_metrics"] = mode
        summary = finetune.run(cfg, callbacks=[rec], overwrite=True)
        got[mode] = (rec.logs, summary, [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()],
                     [list(c) for c in calls])
    logs, summary, metrics, kernel_calls = got["loss"]
    train = [lg for lg in logs if "loss" in lg]
    evals = [lg for lg in logs if "eval_loss" in lg]
    assert len(train) == 3 and evals  # steps 1, 2, 4; the eval at step 4
    for lg in train:
        assert "entropy" not in lg and "mean_token_accuracy" not in lg and lg["num_tokens"] > 0
    assert "eval_entropy" in evals[0] and "eval_mean_token_accuracy" in evals[0]
    # the training steps' kernel calls: log-probabilities only (an eval's calls, in step 4, ask for more)
    train_calls = [c for step in kernel_calls[1:4] for c in step]
    assert len(train_calls) == 3 and all("entropy" not in o and "is_top1" not in o for o in train_calls)
    state = json.loads((tmp_path / "loss" / "checkpoints" / "checkpoint-3" / "trainer_state.json").read_text())
    assert state["log_history"] and not any("entropy" in h or "mean_token_accuracy" in h for h in state["log_history"])
    assert not any("entropy" in m or "mean_token_accuracy" in m for m in metrics)
    # the same training as `deferred`, which still computes both
    d_logs, d_summary, d_metrics, d_calls = got["deferred"]
    assert all("entropy" in o and "is_top1" in o for o in d_calls[1])
    assert all("entropy" in lg for lg in d_logs if "loss" in lg)
    assert [m["loss"] for m in metrics] == pytest.approx([m["loss"] for m in d_metrics], rel=1e-6)
    assert [lg["num_tokens"] for lg in train] == [lg["num_tokens"] for lg in d_logs if "loss" in lg]
    assert summary["tokens"] == d_summary["tokens"]


def _losses_by_head(tmp_path, monkeypatch, shape: str, steps: int, method: str = "lora",
                    amp: bool = False) -> tuple[dict, list[tuple]]:
    """Per-step losses of a run through TRL's head and through Liger's (forced), and each Liger call's
    (rows, chunk_mem_const). Both kernels are Triton (GPU only): torch stand-ins with their signatures run here.
    amp: TrainingArguments' bf16 on (CPU autocast), so accelerate wraps the prepared model's forward as it does
    for a GPU run in bf16 (finetune refuses bf16 on a CPU: the argument is set past that check)."""
    import json

    import torch
    import trl.trainer.utils as trl_utils

    from toolbox_train.commands import finetune
    from toolbox_train.training import step_metrics, trainer

    calls = []

    def flce(x, w, target, bias=None, ignore_index=-100, reduction="mean", softcap=None, chunk_mem_const=1):
        calls.append((x.shape[0], chunk_mem_const))
        z = (x @ w.T + (0 if bias is None else bias)).float()
        if softcap:
            z = softcap * torch.tanh(z / softcap)
        return torch.nn.functional.cross_entropy(z, target, ignore_index=ignore_index, reduction=reduction)

    monkeypatch.setattr(trl_utils, "_ChunkedLogProbFunction", TorchChunkedLogProb)
    monkeypatch.setattr(trainer, "fused_head_ok", lambda inputs: True)
    monkeypatch.setattr(step_metrics, "LIGER_FLCE", [flce])
    if amp:
        from toolbox_train.objectives.sft import config as sft_config

        common = sft_config.common_args
        monkeypatch.setattr(sft_config, "common_args", lambda p, dist: {**common(p, dist), "bf16": True})
    model = bench.build_model_dir(shape, tmp_path / "model")
    data = bench.write_text_dataset(tmp_path / "data.jsonl", 16, 40, 500)
    losses = {}
    for kernel in ("trl", "liger"):
        monkeypatch.setattr(step_metrics.DeferredStepMetrics, "_liger_head", lambda self, f=kernel == "liger": f)
        cfg = {"model": {"path": str(model)}, "data": {"path": str(data), "format": "text", "max_seq_length": 48},
               "method": method, "backend": "hf",
               "train": {"max_steps": steps, "per_device_batch_size": 2, "gradient_checkpointing": False, "seed": 0},
               "output": {"dir": str(tmp_path / kernel), "progress_bar": False, "logging_steps": 1}}
        finetune.run(cfg, overwrite=True)
        losses[kernel] = [m["loss"] for m in map(json.loads, (tmp_path / kernel / "metrics.jsonl").read_text()
                                                 .splitlines()) if "loss" in m]
    return losses, calls


def test_liger_head_gives_trl_heads_loss(tmp_path, monkeypatch):
    """issue 33: `train.lm_head_kernel: liger` computes SFT's training loss with Liger's fused linear
    cross-entropy (no logits recompute in backward, as the bare loops' Liger head) instead of TRL's fused head:
    the same per-step losses. Liger's kernel is Triton (GPU only): a torch stand-in with its signature runs
    here, and the plan's Liger flag (a GPU's) is forced."""
    losses, flce_calls = _losses_by_head(tmp_path, monkeypatch, "tiny-llama", 4)
    assert len(flce_calls) == 4 and len(losses["trl"]) == 4  # one Liger call a step, only in the liger run
    assert losses["liger"] == pytest.approx(losses["trl"], rel=1e-4)


def test_full_fine_tune_in_mixed_precision_takes_the_sync_free_heads(tmp_path, monkeypatch):
    """issue 33 (H100, 2026-12-06): on llama-1b full fine-tuning in bf16 finetune's log said "TRL 1.15's fused
    forward not found on the model" for both heads: accelerate wraps the prepared model's forward in autocast,
    and full fine-tuning prepares the very module TRL patched, so the head swapped in per step was never found
    (LoRA prepares the PEFT wrapper around it). The switch is installed before accelerate prepares the model:
    Liger's head runs every step under the wrapper, TRL's all-positions head beside it, the same losses."""
    from toolbox_train.training import step_metrics

    ways = []
    switch = step_metrics.sync_free_head

    def spy(owner, liger=False):
        ways.append("_original_forward" in owner.__dict__)  # accelerate's mark: its autocast wraps the forward
        return switch(owner, liger)

    monkeypatch.setattr(step_metrics, "sync_free_head", spy)
    losses, calls = _losses_by_head(tmp_path, monkeypatch, "tiny-llama", 3, method="full", amp=True)
    assert ways == [True] * 6  # both runs, every step: the head found on the module accelerate wrapped
    assert len(calls) == 3  # Liger's head: one call a step in the liger run
    assert losses["liger"] == pytest.approx(losses["trl"], rel=1e-3) and len(losses["trl"]) == 3


def test_lm_head_kernel_resolves_and_refuses(tmp_path):
    """auto: Liger's head where Liger is on and the head is frozen (LoRA/QLoRA), or on full fine-tuning where
    Liger's chunks are >= 512 rows (the H100's 2026-12-06 rows: faster at 512 and 1,024, slower at 128); liger
    without Liger (here: no GPU): one line naming the field, exit 2, nothing written."""
    import subprocess
    import sys
    from types import SimpleNamespace

    import yaml

    from toolbox_train.config.schema import load_config
    from toolbox_train.planning import heads

    shapes = {"llama-1b": (2048, 128256), "qwen3-0.6b": (1024, 151936), "gemma3-1b": (1152, 262144)}

    def resolved(method, liger, kernel="auto", shape="llama-1b", batch=8):
        cfg, _ = load_config({"model": {"path": "m"}, "data": {"path": "d.jsonl", "max_seq_length": 2048},
                              "method": method, "train": {"lm_head_kernel": kernel, "per_device_batch_size": batch},
                              "output": {"dir": "o"}})
        hidden, vocab = shapes[shape]
        return heads.pick(cfg, SimpleNamespace(hidden_size=hidden, vocab_size=vocab, model_type="llama"), liger)[0]

    assert [heads.liger_chunk_rows(*a) for a in ((32768, 2048, 128256), (16384, 2048, 128256), (16384, 1024, 151936),
                                                 (16384, 1152, 262144), (8192, 2880, 201088, 8))] == [1024, 512, 128,
                                                                                                       128, 1024]
    assert resolved("lora", True) == resolved("qlora", True) == "liger"
    assert resolved("full", True, batch=16) == resolved("full", True, batch=8) == "liger"  # chunks 1,024 / 512
    assert resolved("full", True, shape="qwen3-0.6b") == resolved("full", True, shape="gemma3-1b") == "trl"  # 128
    assert resolved("full", True, batch=2) == "trl"  # 128 rows
    assert resolved("lora", False) == resolved("lora", True, "trl") == resolved("full", False) == "trl"
    assert resolved("full", True, "liger", shape="gemma3-1b") == "liger"
    model = bench.build_model_dir("tiny-llama", tmp_path / "model")
    data = bench.write_text_dataset(tmp_path / "data.jsonl", 4, 10, 500)
    cfg = tmp_path / "train.yaml"
    cfg.write_text(yaml.safe_dump({"model": {"path": str(model)}, "data": {"path": str(data), "format": "text"},
                                   "method": "lora", "backend": "hf", "train": {"lm_head_kernel": "liger"},
                                   "output": {"dir": str(tmp_path / "out")}}))
    r = subprocess.run([sys.executable, "-m", "toolbox_train.commands.finetune", "--config", str(cfg)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and "train.lm_head_kernel: liger" in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("coef", ["auto", 0.5])
def test_moe_router_loss_on_the_sync_free_head_is_trls(tmp_path, monkeypatch, coef):
    """issue 33: on a mixture of experts (GPT-OSS here) TRL's SFTTrainer adds the router's load-balancing
    loss; the sync-free head (lm_head_tokens all, step metrics summed on the device) adds the same, where it
    used to fall back to TRL's synced step. Every logged value, aux_loss included, is the synced run's;
    with train.router_aux_loss_coef 0 the losses differ (the router loss counted)."""
    import trl.trainer.utils as trl_utils
    from transformers import TrainerCallback

    from toolbox_train.training import trainer

    monkeypatch.setattr(trl_utils, "_ChunkedLogProbFunction", TorchChunkedLogProb)
    monkeypatch.setattr(trainer, "fused_head_ok", lambda inputs: True)
    from toolbox_train.training import step_metrics

    model = bench.build_model_dir("tiny-gpt-oss", tmp_path / "model")
    data = bench.write_text_dataset(tmp_path / "data.jsonl", 16, 40, 500)
    ours = []
    deferred = step_metrics.DeferredStepMetrics.fused_nll_deferred
    monkeypatch.setattr(step_metrics.DeferredStepMetrics, "fused_nll_deferred",
                        lambda self, *a: ours.append(self.toolbox_run.cfg.output.step_metrics) or deferred(self, *a))

    class Logs(TrainerCallback):
        def __init__(self):
            self.logs = []

        def on_log(self, args, state, control, logs=None, **kw):
            self.logs.append(dict(logs))

    got = {}
    for mode, c in (("deferred", coef), ("synced", coef), ("loss", 0)):
        rec = Logs()
        cfg = {"model": {"path": str(model)}, "data": {"path": str(data), "format": "text", "max_seq_length": 48},
               "method": "lora", "backend": "hf",
               "train": {"max_steps": 4, "per_device_batch_size": 2, "gradient_accumulation_steps": 2,
                         "gradient_checkpointing": False, "seed": 0, "router_aux_loss_coef": c},
               "output": {"dir": str(tmp_path / f"{mode}-{c}"), "progress_bar": False, "step_metrics": mode,
                          "logging_steps": 2}}
        from toolbox_train.commands import finetune

        finetune.run(cfg, callbacks=[rec], overwrite=True)
        got[mode] = [lg for lg in rec.logs if "loss" in lg]
        resolved = (tmp_path / f"{mode}-{c}" / "config.resolved.yaml").read_text()
        assert f"router_aux_loss_coef: {c}" in resolved
    d, s = got["deferred"], got["synced"]
    assert len(d) == len(s) == 3 and all("aux_loss" in lg for lg in d + s)  # steps 1, 2, 4
    assert ours == ["deferred"] * 8 + ["loss"] * 8  # the sync-free step took every micro-batch, synced none
    for a, b in zip(d, s):
        for k in ("loss", "aux_loss", "grad_norm", "entropy", "mean_token_accuracy", "num_tokens"):
            assert a[k] == pytest.approx(b[k], rel=1e-5, abs=1e-6), (k, a, b)
    assert all("aux_loss" not in lg for lg in got["loss"])  # coefficient 0: TRL turns the router loss off
    assert [lg["loss"] for lg in got["loss"]] != pytest.approx([lg["loss"] for lg in d], rel=1e-4)


def test_liger_head_takes_the_chunk_budget_of_liger_s_own_forward(tmp_path, monkeypatch):
    """issue 33 (H100, 2026-12-06): with the router loss on both sides, finetune's Liger head on GPT-OSS ran
    0.892x the bare + Liger loop, whose forward (Liger's GPT-OSS lce_forward) passes chunk_mem_const 8 to the
    fused cross-entropy; finetune's call took the default 1 (64 chunks of 128 tokens a step instead of 8 of
    1,024 on a 201k vocabulary). finetune now reads the family's constant from Liger's model module. Liger is
    GPU-only: a module with the constant stands in for liger_kernel.transformers.model.gpt_oss."""
    import sys
    import types

    from toolbox_train.planning import heads

    fake = types.ModuleType("liger_kernel.transformers.model.gpt_oss")
    fake._GPT_OSS_FLCE_CHUNK_MEM_CONST = 8
    monkeypatch.setitem(sys.modules, "liger_kernel.transformers.model.gpt_oss", fake)
    losses, calls = _losses_by_head(tmp_path, monkeypatch, "tiny-gpt-oss", 3)
    assert [c for _, c in calls] == [8, 8, 8]  # one call a step, the family's budget
    assert losses["liger"] == pytest.approx(losses["trl"], rel=1e-4)  # the router loss on both
    llama = types.SimpleNamespace(model_type="llama")
    monkeypatch.setitem(sys.modules, "liger_kernel.transformers.model.llama", types.ModuleType("llama"))
    assert heads.liger_chunk_mem_const(llama) == 1


def test_plan_offers_the_head_that_measured_faster(tmp_path):
    """`finetune --plan --machine h200` (config.json only, no weights): llama-1b full at the picked batch 16
    gets Liger's head (1,024-row chunks), qwen3-0.6b keeps TRL's (256); nothing written."""
    import subprocess
    import sys

    import yaml
    from transformers import AutoConfig

    from toolbox_train.bench.shapes import SHAPES

    (tmp_path / "d.jsonl").write_text('{"text": "hello"}\n')
    said = {}
    for name in ("llama-1b", "qwen3-0.6b"):
        shape = dict(SHAPES[name])
        AutoConfig.for_model(shape.pop("model_type"), **shape).save_pretrained(tmp_path / name)
        cfg = tmp_path / f"{name}.yaml"
        cfg.write_text(yaml.safe_dump({"model": {"path": str(tmp_path / name)},
                                       "data": {"path": str(tmp_path / "d.jsonl"), "format": "text",
                                                "max_seq_length": 2048},
                                       "method": "full", "backend": "hf", "train": {"per_device_batch_size": "auto"},
                                       "output": {"dir": str(tmp_path / f"out-{name}")}}))
        r = subprocess.run([sys.executable, "-m", "toolbox_train.commands.finetune", "--config", str(cfg), "--plan",
                            "--machine", "h200"], capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr
        said[name] = [ln for ln in (r.stdout + r.stderr).splitlines() if "lm_head_kernel: auto" in ln]
        assert not (tmp_path / f"out-{name}").exists()
    assert said["llama-1b"] == ["train.lm_head_kernel: auto -> liger (Liger's chunks of 1024 rows, at least 512: "
                                "faster than TRL's head there)"]
    assert said["qwen3-0.6b"] == ["train.lm_head_kernel: auto -> trl (Liger's chunks would be 256 rows, under 512: "
                                  "TRL's head is faster there)"]
