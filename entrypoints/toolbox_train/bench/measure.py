"""What the row workers share: step timing, token counting, peak memory, the model loaders, and a
result from the timed steps."""

from __future__ import annotations

import math
import time
from typing import Any

from toolbox_train.models.arithmetic import GiB, expert_targets
from toolbox_train.models.families import family
from toolbox_train.bench.shapes import LORA_TARGETS, SHAPES


class StepTimer:
    """Wall time between consecutive optimizer-step ends, with the device synchronised."""

    def __init__(self, device: str):
        self.device = device
        self.t_last: float | None = None
        self.times: list[float] = []

    def sync(self):
        if self.device.startswith("cuda"):
            import torch

            torch.cuda.synchronize()

    def start(self):
        self.sync()
        self.t_last = time.perf_counter()

    def step(self) -> float:
        self.sync()
        t = time.perf_counter()
        dt = t - self.t_last
        self.t_last = t
        self.times.append(dt)
        return dt


def count_tokens(batch: dict) -> int:
    """Tokens actually processed in a (micro-)batch: padding excluded.

    Padded batches carry attention_mask; padding-free (packed, flattened) batches carry
    position_ids or cu_seq_lens and no padding at all.
    """
    am = batch.get("attention_mask")
    if am is not None:
        return int(am.sum())
    return int(batch["input_ids"].numel())


class CountingCollator:
    """Wraps a Trainer's collator to count the tokens of each batch it hands out."""

    def __init__(self, inner):
        self.inner = inner
        self.tokens = 0

    def __call__(self, features):
        batch = self.inner(features)
        self.tokens += count_tokens(batch)
        return batch


def spec_device(spec: dict) -> str:
    return spec.get("device", "cuda")


def reset_peak(device: str):
    if device.startswith("cuda"):
        import torch

        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


def peak_gib(device: str) -> float | None:
    if device.startswith("cuda"):
        import torch

        return torch.cuda.max_memory_allocated() / GiB
    return None


def apply_liger(model):
    from liger_kernel.transformers import _apply_liger_kernel_to_instance

    _apply_liger_kernel_to_instance(model=model)


def router_kwargs(model, opts: dict) -> dict:
    """The forward's arguments that train what TRL's SFTTrainer (finetune) trains on a mixture of experts:
    the router's load-balancing loss added with the model config's coefficient, unless the row sets
    router_aux_loss_coef=0 (as finetune's train.router_aux_loss_coef). Dense models: none."""
    tc = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    if opts.get("router_aux_loss_coef", "auto") == 0 or not hasattr(tc, "output_router_logits") \
            or not getattr(tc, "router_aux_loss_coef", 0):
        return {}
    return {"output_router_logits": True}


def attn_implementation(shape: str) -> dict[str, str]:
    """SDPA, where the model has it. transformers' GPT-OSS has none (its attention sinks): no argument,
    so transformers' own default (eager) runs, as in `finetune` without `model.attn_implementation`."""
    return {} if family(SHAPES[shape]["model_type"]).eager_attention else {"attn_implementation": "sdpa"}


def lora_config(shape: str):
    """The bare HF loops' LoRA: the seven projections, and on fused-expert MoE models (GPT-OSS) the experts'
    parameters too, as finetune's HF path (models/lora.py) and Unsloth adapt them: the same work per row."""
    from peft import LoraConfig

    extra = expert_targets(SHAPES[shape]["model_type"], LORA_TARGETS)
    return LoraConfig(r=16, lora_alpha=16, lora_dropout=0.0, target_modules=LORA_TARGETS, task_type="CAUSAL_LM",
                      **({"target_parameters": extra} if extra else {}))


def load_hf(spec: dict, model_dir: str):
    import torch
    from transformers import AutoModelForCausalLM

    method, opts, device = spec["method"], spec["options"], spec_device(spec)
    kw: dict[str, Any] = dict(dtype=getattr(torch, spec.get("dtype", "bfloat16")), **attn_implementation(spec["shape"]))
    if method == "qlora":
        from transformers import BitsAndBytesConfig

        kw["quantization_config"] = BitsAndBytesConfig(
            load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=torch.bfloat16)
        kw["device_map"] = {"": 0}
    model = AutoModelForCausalLM.from_pretrained(model_dir, **kw)
    if method != "qlora":
        model.to(device)
    if opts.get("liger"):
        apply_liger(model)
    if opts.get("ckpt"):
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if method in ("lora", "qlora"):
        from peft import get_peft_model

        if method == "qlora":
            from peft import prepare_model_for_kbit_training

            model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=bool(opts.get("ckpt")))
        if opts.get("ckpt"):
            model.enable_input_require_grads()
        model = get_peft_model(model, lora_config(spec["shape"]))
    if opts.get("compile") == "layers":
        base = model.get_base_model() if hasattr(model, "get_base_model") else model
        for layer in base.model.layers:
            layer.compile()
    elif opts.get("compile") == "model":
        model.compile()
    return model


def load_unsloth(spec: dict, model_dir: str, seq: int):
    import torch
    from unsloth import FastLanguageModel, FastModel

    method = spec["method"]
    # as finetune does: FastModel for Gemma 3, FastLanguageModel for the text-only families
    loader = FastModel if family(SHAPES[spec["shape"]]["model_type"]).unsloth_fast_model else FastLanguageModel
    model, _tok = loader.from_pretrained(
        model_name=model_dir, max_seq_length=seq, dtype=torch.bfloat16,
        load_in_4bit=method == "qlora", full_finetuning=method == "full",
        use_gradient_checkpointing="unsloth")
    if method in ("lora", "qlora"):
        kw: dict[str, Any] = dict(r=16, lora_alpha=16, lora_dropout=0, bias="none",
                                  use_gradient_checkpointing="unsloth", random_state=0)
        if loader is FastModel:
            kw.update(finetune_vision_layers=False, finetune_language_layers=True,
                      finetune_attention_modules=True, finetune_mlp_modules=True)
        else:
            kw["target_modules"] = LORA_TARGETS
        model = loader.get_peft_model(model, **kw)
    return model


def result_from_steps(spec: dict, times: list[float], tokens: list[int], losses: list[float],
                       peak: float | None) -> dict:
    w = spec["warmup"]
    if len(times) <= w:
        raise RuntimeError(f"only {len(times)} steps recorded, {w} are warm-up: nothing timed")
    timed_t, timed_n = times[w:], tokens[w:]
    per_step = [n / t for n, t in zip(timed_n, timed_t)]
    return {
        "status": "ok",
        "tokens_per_s": sum(per_step) / len(per_step),
        "tokens_per_s_stdev": _stdev(per_step),
        "tokens_per_step": sum(timed_n) / len(timed_n),
        "step_s": sum(timed_t) / len(timed_t),
        "steps_timed": len(timed_t),
        "peak_gib": peak,
        "step_times": [round(t, 4) for t in times],
        "loss_first": losses[0] if losses else None,
        "loss_last": losses[-1] if losses else None,
    }


def _stdev(xs: list[float]) -> float:
    m = sum(xs) / len(xs)
    return math.sqrt(sum((x - m) ** 2 for x in xs) / max(1, len(xs) - 1))
