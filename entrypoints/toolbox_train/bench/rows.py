"""Row workers (each runs in its own process: Unsloth and Liger patch transformers at import time)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from toolbox_train.disk import atomic_write, write_json
from toolbox_train.bench.environment import versions
from toolbox_train.bench.measure import (CountingCollator, StepTimer, apply_liger, attn_implementation, count_tokens, load_hf,
                      load_unsloth, lora_config, peak_gib, reset_peak, result_from_steps, router_kwargs,
                      spec_device)
from toolbox_train.bench.shapes import LORA_TARGETS, SHAPES, SPECIAL_TOKENS
from toolbox_train.bench.synthetic import read_token_batches


def run_bare(spec: dict, model_dir: str) -> dict:
    """The model, AdamW and a plain loop: the backend's best case, no Trainer in the way."""
    import torch

    device, opts = spec_device(spec), spec["options"]
    batch, seq = opts.get("batch", spec["batch"]), spec["seq"]
    reset_peak(device)
    if spec["backend"] == "unsloth":
        model = load_unsloth(spec, model_dir, seq)
    else:
        model = load_hf(spec, model_dir)
    model.train()
    # HF rows train finetune's objective (the MoE router loss too); Unsloth's forward is left as it is
    router = router_kwargs(model, opts) if spec["backend"] == "hf" else {}
    params = [p for p in model.parameters() if p.requires_grad]
    fused = {"fused": True} if device.startswith("cuda") else {}
    opt = torch.optim.AdamW(params, lr=spec["lr"][spec["method"] if spec["method"] == "full" else "lora"],
                            weight_decay=0.0, **fused)
    n_steps = spec["warmup"] + spec["steps"]
    batches = read_token_batches(spec["data"], batch, seq, n_steps)
    timer, losses, tokens = StepTimer(device), [], []
    timer.start()
    for cpu_ids in batches:
        ids = cpu_ids.to(device, non_blocking=True)
        mb = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
        out = model(**mb, labels=ids, **router)
        out.loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(float(out.loss.detach()))
        tokens.append(count_tokens(mb))
        timer.step()
        del out
    return result_from_steps(spec, timer.times, tokens, losses, peak_gib(device))


def run_trl(spec: dict, model_dir: str, data_path: str, workdir: str) -> dict:
    """TRL SFTTrainer with HF + PEFT LoRA, as its documentation shows it."""
    import torch
    from datasets import load_dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import SFTConfig, SFTTrainer

    device, opts = spec_device(spec), spec["options"]
    cpu = not device.startswith("cuda")
    reset_peak(device)
    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16, **attn_implementation(spec["shape"]))
    if opts.get("liger"):
        apply_liger(model)
    ds = load_dataset("json", data_files=data_path, split="train")
    args = SFTConfig(
        output_dir=workdir, per_device_train_batch_size=opts.get("batch", spec["batch"]),
        gradient_accumulation_steps=1, max_steps=spec["warmup"] + spec["steps"],
        learning_rate=spec["lr"]["lora"], lr_scheduler_type="constant", warmup_steps=0, weight_decay=0.0,
        logging_steps=1, save_strategy="no", report_to="none", bf16=True, use_cpu=cpu,
        gradient_checkpointing=bool(opts.get("ckpt")), max_length=spec["seq"], packing=False,
        dataset_text_field="text", optim="adamw_torch" if cpu else "adamw_torch_fused",
        dataloader_num_workers=0, seed=0, disable_tqdm=True,
    )
    timer, losses, tokens = StepTimer(device), [], []

    class Timing(TrainerCallback):
        def on_train_begin(self, *a, **k):
            self.seen = 0
            timer.start()

        def on_step_end(self, *a, **k):
            timer.step()
            tokens.append(collator.tokens - self.seen)
            self.seen = collator.tokens

        def on_log(self, args, state, control, logs=None, **k):
            if logs and "loss" in logs:
                losses.append(float(logs["loss"]))

    trainer_cls = SFTTrainer
    if cpu:
        from transformers import Trainer

        class CPUSFTTrainer(SFTTrainer):
            # TRL 1.15's loss is a Triton kernel; only the harness's CPU tests take this path.
            def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
                return Trainer.compute_loss(self, model, inputs, return_outputs, num_items_in_batch)

        trainer_cls = CPUSFTTrainer
    trainer = trainer_cls(model=model, args=args, train_dataset=ds, processing_class=tok,
                         peft_config=lora_config(spec["shape"]),
                         callbacks=[Timing()])
    collator = CountingCollator(trainer.data_collator)
    trainer.data_collator = collator
    trainer.train()
    return result_from_steps(spec, timer.times, tokens, losses, peak_gib(device))


def finetune_config(spec: dict, model_dir: str, data_path: str, output_dir: str) -> dict:
    """The train.yaml a user would write for this row; everything else is finetune's own default."""
    opts = spec["options"]
    train: dict[str, Any] = {
        "max_steps": spec["warmup"] + spec["steps"],
        "per_device_batch_size": opts.get("batch", spec["batch"]),
        "learning_rate": spec["lr"]["full" if spec["method"] == "full" else "lora"],
        "lr_scheduler": "constant",
        "precision": "bf16" if spec_device(spec).startswith("cuda") else "fp32",
        "seed": 0,
    }
    for opt, key in (("ckpt", "gradient_checkpointing"), ("liger", "liger"), ("optim", "optimizer"),
                     ("lm_head_tokens", "lm_head_tokens"), ("lm_head_kernel", "lm_head_kernel"),
                     ("router_aux_loss_coef", "router_aux_loss_coef")):
        if opt in opts:
            train[key] = opts[opt]
    cfg: dict[str, Any] = {
        "model": {"path": model_dir},
        "data": {"path": data_path, "format": "text", "max_seq_length": spec["seq"],
                 "packing": bool(opts.get("packing", False))},
        "method": spec["method"],
        "backend": spec["backend"],
        "train": train,
        "output": {"dir": output_dir, "save_steps": 0, "logging_steps": 1, "progress_bar": False},
    }
    for opt in ("step_metrics", "nan_inf_filter"):  # issue 26's per-step host work, turned back on
        if opt in opts:
            cfg["output"][opt] = opts[opt]
    if "loader_workers" in opts:
        cfg["data"]["loader_workers"] = opts["loader_workers"]
    if spec["method"] != "full":
        cfg["lora"] = {"r": 16, "alpha": 16, "dropout": 0.0, "target_modules": LORA_TARGETS}
    return cfg


def steps_from_metrics(out_dir: Path) -> tuple[list[float], list[int], list[float], float | None]:
    """Per-step time and tokens from finetune's metrics.jsonl (`tokens` is the running total)."""
    from toolbox_train.runs.folder import METRICS

    times, tokens, losses, peaks = [], [], [], []
    prev = 0
    with open(out_dir / METRICS) as f:
        for line in f:
            if not line.strip():
                continue
            m = json.loads(line)
            n = int(m["tokens"]) - prev
            prev = int(m["tokens"])
            if n <= 0 or not m.get("tokens_per_s"):
                continue
            tokens.append(n)
            times.append(n / m["tokens_per_s"])
            losses.append(float(m["loss"]))
            if m.get("peak_mem_gib") is not None:
                peaks.append(float(m["peak_mem_gib"]))
    return times, tokens, losses, (max(peaks) if peaks else None)


def run_finetune(spec: dict, model_dir: str, data_path: str, workdir: str) -> dict:
    from toolbox_train.commands import finetune

    device = spec_device(spec)
    out_dir = Path(workdir) / "out"
    reset_peak(device)
    finetune.run(finetune_config(spec, model_dir, data_path, str(out_dir)), overrides=spec.get("set", ()),
                 overwrite=True)
    times, tokens, losses, _ = steps_from_metrics(out_dir)
    res = result_from_steps(spec, times, tokens, losses, peak_gib(device))
    res["resolved"] = _resolved(out_dir)
    return res


def run_launch(spec: dict, model_dir: str, data_path: str, workdir: str) -> dict:
    import yaml

    out_dir = Path(workdir) / "out"
    cfg_path = Path(workdir) / "train.yaml"
    atomic_write(cfg_path, yaml.safe_dump(finetune_config(spec, model_dir, data_path, str(out_dir))))
    cmd = [sys.executable, "-m", "toolbox_train.commands.launch", "--strategy", spec["options"].get("strategy", "fsdp"),
           "--nproc", "1", "--", "finetune", "--config", str(cfg_path), "--overwrite"]
    print("+", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True)
    times, tokens, losses, peak = steps_from_metrics(out_dir)
    res = result_from_steps(spec, times, tokens, losses, peak)
    res["command"] = " ".join(cmd[2:])
    res["resolved"] = _resolved(out_dir)
    return res


def _resolved(out_dir: Path) -> dict | None:
    import yaml

    from toolbox_train.runs.folder import RESOLVED_CONFIG  # not at import: the package stays stdlib-only

    p = out_dir / RESOLVED_CONFIG
    if not p.exists():
        return None

    return yaml.safe_load(p.read_text())


def run_memscale(spec: dict, model_dir: str) -> dict:
    """LoRA at batch 1: one training step per length, doubling until out of memory."""
    import torch

    device = spec_device(spec)
    lengths = spec.get("lengths") or [8192 * 2**i for i in range(6)]
    max_pos = SHAPES[spec["shape"]]["max_position_embeddings"]
    lengths = [n for n in lengths if n <= max_pos]
    model = (load_unsloth(spec, model_dir, max(lengths)) if spec["backend"] == "unsloth"
             else load_hf(spec, model_dir))
    model.train()
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)
    probes = []
    for n in lengths:
        reset_peak(device)
        ids = torch.randint(len(SPECIAL_TOKENS), spec["tok_vocab"], (1, n)).to(device)
        t0 = time.perf_counter()
        try:
            out = model(input_ids=ids, labels=ids)
            out.loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            StepTimer(device).sync()
            probes.append({"seq": n, "fits": True, "peak_gib": peak_gib(device),
                           "step_s": time.perf_counter() - t0})
            del out
        except torch.OutOfMemoryError:
            probes.append({"seq": n, "fits": False})
            break
        finally:
            opt.zero_grad(set_to_none=True)
        print(f"memscale {spec['backend']}: {probes[-1]}", flush=True)
    fit = [p["seq"] for p in probes if p["fits"]]
    return {"status": "ok", "probes": probes, "max_seq": max(fit) if fit else 0,
            "max_seq_bounded": bool(probes) and probes[-1]["fits"]}


def worker(spec_path: str, result_path: str) -> int:
    spec = json.loads(Path(spec_path).read_text())
    t0 = time.time()
    pf = spec["options"].get("padding_free")
    if pf is not None:  # Unsloth's auto padding-free (finetune turns it off unless told): read at import
        os.environ["UNSLOTH_DISABLE_AUTO_PADDING_FREE"] = "0" if pf else "1"
    if spec["backend"] == "unsloth" and spec["kind"] in ("bare", "memscale"):  # finetune imports it itself
        import unsloth  # noqa: F401  (must patch transformers/trl/peft before they are imported)
    import torch

    if spec.get("device", "cuda").startswith("cuda"):
        torch.backends.cuda.matmul.allow_tf32 = True
    kind = spec["kind"]
    workdir = tempfile.mkdtemp(prefix="row-", dir=spec["workdir"])
    try:
        if kind == "bare":
            res = run_bare(spec, spec["model_dir"])
        elif kind == "trl":
            res = run_trl(spec, spec["model_dir"], spec["data"], workdir)
        elif kind == "finetune":
            res = run_finetune(spec, spec["model_dir"], spec["data"], workdir)
        elif kind == "launch":
            res = run_launch(spec, spec["model_dir"], spec["data"], workdir)
        elif kind == "memscale":
            res = run_memscale(spec, spec["model_dir"])
        else:
            raise ValueError(f"unknown row kind {kind!r}")
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    res["wall_s"] = time.time() - t0
    res["versions"] = versions()
    write_json(Path(result_path), res)
    return 0
