"""How an objective that generates samples its completions (its section's `generation`): transformers'
`generate` with its dynamic cache (TRL's default), the same with a static cache and compiled decoding
(`transformers-static`: the config's cache_implementation "static", the compile TRL turns off turned back
on by generation/trainer.py), transformers' continuous batching (`transformers-paged`: TRL's
`use_transformers_continuous_batching`), or TRL's vLLM colocate mode (`use_vllm`, `vllm_mode:
colocate`: a vLLM engine in the training process, its share of memory `vllm_gpu_memory_utilization`).
`compiled` is the Toolbox's own decoding loop over the same static cache (generation/decode.py: one
compiled step per token, the host's check every 32 tokens), set by hand: a run it cannot serve
(`compiled_refusal`: the model, the sampling settings, the backend) is refused in one line. `auto` picks the
fastest this machine runs (`pick`), measured on an H100
(docs/preference.md); the pick is made once, when the run is resolved (`extras`), and every later step
reads it there.

vLLM's PyPI wheels are CUDA builds, each pinned to one torch (vLLM 0.31.0 and 0.32.0: torch==2.13.0,
the cuda stack's; 0.33.0 and 0.34.0: torch==2.14.0); TRL 1.15 declares vLLM 0.21.0-0.31.0 supported
(its `vllm` extra and `is_vllm_available`). `refusal` reads the installed vLLM's own metadata
before the model loads, so a missing or mismatched vLLM is exit 2 and not a crash inside TRL.

With LoRA the transformers samplers generate on merged weights (`merge_lora`, `merge`): each adapted
linear layer's W + scale * B @ A in a buffer of its own, made again after each optimizer step, swapped in
for the generation with that layer's adapter off (generation/trainer.py). The base weights are never
written, so the update is exactly the unmerged run's; the buffers stay for the whole run (the memory plan
counts them: `memory`).
"""

from __future__ import annotations

import dataclasses
import importlib
from importlib.metadata import PackageNotFoundError, requires, version
from typing import Literal

from pydantic import BaseModel, Field

from toolbox_train.contract import UserError

VLLM_FOR_TRL = "0.31.0"  # the newest vLLM TRL 1.15 declares supported; the `vllm` extra pins it
MODES = ("auto", "transformers", "transformers-static", "compiled", "transformers-paged", "vllm-colocate")
Mode = Literal[MODES]  # type: ignore[valid-type]
Merge = bool | Literal["auto"]


def mode_field():
    """The section's `generation` field (each unit that generates declares it, in its own order)."""
    return Field("auto", description="auto (the fastest sampler this machine runs), transformers (generate, dynamic "
                                     "cache), transformers-static (static cache, compiled decoding), compiled (the "
                                     "Toolbox's decoding loop, one compiled step per token: generation/decode.py), "
                                     "transformers-paged (continuous batching), vllm-colocate (generation/sampler.py)")


def memory_field():
    """The section's `vllm_gpu_memory_utilization` field."""
    return Field(None, gt=0, lt=1, description="vllm-colocate: the GPU memory share vLLM takes (TRL's default 0.3)")


def merge_field():
    """The section's `merge_lora` field."""
    return Field("auto", description="LoRA: generate on the adapters merged into a copy of the adapted weights "
                                     "(auto: wherever it can; generation/sampler.py merge)")


def fields_problem(section) -> str | None:
    """What is wrong with the two fields together (the section's validator raises it), or None."""
    if section.vllm_gpu_memory_utilization is not None and section.generation != "vllm-colocate":
        return "vllm_gpu_memory_utilization belongs to generation: vllm-colocate"
    return None


def _torch_pin() -> str | None:
    """The installed vLLM's own requirement on torch (`Requires-Dist: torch==...`), or None."""
    from packaging.requirements import InvalidRequirement, Requirement

    for line in requires("vllm") or []:
        try:
            req = Requirement(line)
        except InvalidRequirement:
            continue
        if req.name.lower() == "torch" and (req.marker is None or req.marker.evaluate({"extra": ""})):
            return str(req.specifier)
    return None


def refusal(section, field: str, backend: str, gpu: bool) -> str | None:
    """Why `<field>: vllm-colocate` cannot run here (one line naming the field), or None. `field`: where
    the section's generation is written (`grpo.generation`). The installed packages first (what an image
    fixes), then the machine."""
    if section.generation != "vllm-colocate":
        return None
    field = f"{field}: vllm-colocate"
    try:
        have = version("vllm")
    except PackageNotFoundError:
        return (f"{field} needs vLLM, which is not installed (on the cuda stack: pip install "
                f"'vllm=={VLLM_FOR_TRL}', the `vllm` extra; docs/preference.md); or use generation: transformers")
    from packaging.specifiers import SpecifierSet
    from packaging.version import Version

    torch_have = version("torch")
    pin = _torch_pin()
    if pin and not SpecifierSet(pin).contains(Version(torch_have), prereleases=True):
        return (f"{field}: vLLM {have} requires torch{pin}, the installed torch is {torch_have}; install the vLLM "
                f"release built for this torch (vLLM 0.31.0 and 0.32.0 pin torch 2.13.0, the cuda stack's) "
                f"or use generation: transformers")
    if backend == "unsloth":
        # Unsloth's patched trainers take the vLLM engine of a model loaded with fast_inference,
        # which finetune does not load; TRL's own colocate mode runs on the hf backend
        return f"{field} runs TRL's colocate mode on backend hf (backend: auto picks it); backend is unsloth"
    if not gpu:
        return f"{field} generates on a CUDA GPU and this run is on the CPU; use generation: transformers"
    import torch

    if torch.version.cuda is None:
        return (f"{field}: vLLM's PyPI wheels are CUDA builds and this torch ({torch_have}) is not "
                f"(ROCm: {torch.version.hip}); use generation: transformers")
    try:
        importlib.import_module("vllm")
    except Exception as exc:  # a broken install: say so now, not after the model has loaded
        from toolbox_train.contract import first_line

        return f"{field}: vLLM {have} is installed but does not import: {first_line(exc)}"
    return None


def compiled_refusal(section, ctx) -> str | None:
    """Why the compiled loop (generation/decode.py) cannot serve this run, or None: the backend, FSDP, the
    model (its config read before it loads) or the generation config TRL will build from the section
    (its sampling fields, then the model's generation_config.json for what TRL leaves unset, as generate
    reads them)."""
    if ctx.backend == "unsloth":
        return "backend unsloth generates with its own patched trainer"
    if ctx.fsdp:
        return "FSDP shards the weights"
    from transformers import GenerationConfig

    from toolbox_train.generation import decode
    from toolbox_train.planning.inputs import load_model_config, resolve_model

    path = resolve_model(ctx.cfg, ctx.base)
    why = decode.model_unsupported(load_model_config(path, ctx.cfg))
    if why:
        return f"the model: {why}"
    gc = GenerationConfig(max_new_tokens=section.max_completion_length, do_sample=True,
                          **{k: getattr(section, k, None) for k in SAMPLING})
    try:
        model_gc = GenerationConfig.from_pretrained(path, revision=ctx.cfg.model.revision)
    except (OSError, ValueError):  # no generation_config.json: generate reads the global defaults alone
        model_gc = GenerationConfig()
    gc.update(**model_gc.to_dict(), defaults_only=True)
    gc.update(**GenerationConfig._get_default_generation_params(), defaults_only=True)
    why = decode.unsupported(gc)
    return f"the generation config: {why}" if why else None


class Sampling(BaseModel):
    """TRL's sampling settings beside the temperature, under its GRPOConfig/RLOOConfig names and defaults (what TRL
    puts in its GenerationConfig); the sections that generate take them by inheriting this. `compiled` serves all
    but repetition_penalty, which it refuses (compiled_refusal)."""
    top_p: float = Field(1.0, gt=0, le=1, description="nucleus sampling: the smallest set of tokens this likely")
    top_k: int = Field(0, ge=0, description="sample among the k likeliest tokens (0: all)")
    min_p: float | None = Field(None, ge=0, le=1, description="drop tokens below min_p x the top token's probability")
    repetition_penalty: float = Field(1.0, gt=0, description="> 1 penalizes tokens already in the prompt "
                                      "or completion")


SAMPLING = ("temperature", *Sampling.model_fields)  # what compiled_refusal reads from a section


def pick(section, backend: str, gpu: bool) -> tuple[str, str]:
    """The sampler a run uses, and why: the section's `generation` as set, or what `auto` resolves to.
    `gpu`: the run (or the machine planned for) trains on a GPU."""
    g = section.generation
    if g != "auto":
        return g, "set in the config"
    if backend == "unsloth":
        # Unsloth's patched trainer generates with its own cache (it passes cache_implementation to generate
        # itself): 2.11 s a step vs 2.05 with the static cache on top, one row each (H100, 2026-12-06,
        # docs/bench/2026-12-06-h100/grpo-unsloth-2/): no compile to wait for, for no measured gain
        return "transformers", ("auto: backend unsloth, its own generation (H100, 2026-12-06: 2.11 s a step, "
                                "4.4x TRL's default path on hf)")
    if not gpu:
        # transformers compiles decoding only on an accelerator (generate's _valid_auto_compile_criteria):
        # a static cache alone is the dynamic one's work in a preallocated buffer
        return "transformers", "auto: on the CPU transformers compiles no decoding"
    # `compiled` (generation/decode.py) is not picked until a GPU row measures it against this one: every
    # device call of 2026-12-07's fifth session was refused or taken back (docs/bench/NEXT-CALL.md)
    return "transformers-static", ("auto: static cache + compiled decoding (H100, 2026-12-06: 2.9x generate's "
                                   "dynamic cache on llama-1b, 4.5x on qwen3-0.6b)")


def merge(section, where: str, sampler: str, ctx) -> tuple[bool, str]:
    """Whether the sampler generates on merged LoRA weights, and why (`where`: the section's name). Only
    LoRA over 16/32-bit weights (a quantized base has no weight to add B @ A to), TRL's transformers
    samplers on backend hf (vLLM syncs merged weights itself; Unsloth generates with its own kernels),
    unsharded parameters (under FSDP no rank holds a whole weight)."""
    want = section.merge_lora
    if want is False:
        return False, "set in the config"
    why_not = ("method is not lora" if ctx.cfg.method != "lora" else "backend unsloth generates itself"
               if ctx.backend == "unsloth" else "vLLM syncs merged weights itself" if sampler == "vllm-colocate"
               else "FSDP shards the weights" if ctx.fsdp else None)
    if why_not and want is True:
        raise UserError(f"{where}.merge_lora: true cannot run here: {why_not}")
    if why_not:
        return False, f"auto: {why_not}"
    return True, "set in the config" if want is True else "auto: LoRA, unsharded, a transformers sampler"


def resolve(section, field: str, ctx, modes: tuple[str, ...] = MODES) -> dict:
    """The unit's resolve: the sampler picked once, and why, and whether it generates on merged LoRA
    weights (`extras` of the resolved run: `sampler`, `sampler_why`, `sampler_merged`). `modes`: the
    samplers the unit's TRL trainer has (a mode it lacks is refused)."""
    if section.generation not in modes:
        raise UserError(f"{field}: {section.generation} is not a sampler this objective's trainer has "
                        f"({', '.join(modes)})")
    why_not = compiled_refusal(section, ctx) if section.generation == "compiled" else None
    if why_not:  # set by hand, as merge_lora: true is: refused, not swapped for another sampler
        fallback = "transformers-static" if ctx.gpu else "transformers"
        raise UserError(f"{field}: compiled cannot serve this run: {why_not}; use {fallback} (or auto)")
    sampler, why = pick(section, ctx.backend, ctx.gpu)
    merged, merged_why = merge(section, field.rpartition('.')[0], sampler, ctx)
    return {"sampler": sampler, "sampler_why": why, "sampler_merged": merged, "sampler_merged_why": merged_why}


def prepare(section, field: str, backend: str, gpu: bool) -> None:
    """The unit's prepare: the sampler can run here (vLLM installed and matching), else UserError."""
    why = refusal(section, field, backend, gpu)
    if why:
        raise UserError(why)


def check_groups(section, where: str, per_device: int, grad_accum: int, world_size: int) -> None:
    """TRL's generation batch (per_device_batch_size x steps_per_generation, else x the accumulation, x
    ranks) holds whole groups of the section's `num_generations`; UserError naming `<where>.num_generations`."""
    spg = section.steps_per_generation
    batch = per_device * (spg or grad_accum) * world_size
    if batch % section.num_generations:
        steps = f"{where}.steps_per_generation" if spg else "accumulation"
        raise UserError(f"{where}.num_generations: {section.num_generations} completions per prompt must divide the "
                        f"global batch of completions ({batch}: per_device_batch_size x {steps} x ranks)")


def kv_cache_bytes(shape, sequences: int, tokens: int, dtype_bytes: int) -> float:
    """The sampler's KV cache: `sequences` completions of `tokens` positions each (prompt + completion;
    a static cache allocates the whole length up front), K and V in every layer."""
    return float(sequences * tokens * shape.layers * shape.kv_heads * shape.head_dim * 2 * dtype_bytes)


def memory(cfg, extras: dict, st, shape, world: int, completion_tokens: int, per_generation: int | None) -> tuple:
    """The unit's memory: the KV cache of the completions each device generates at once (TRL's generation
    batch: per_device_batch_size x `per_generation` (None: the accumulation), each prompt + completion
    long), the merged LoRA weights where it generates on them, and the banner's note of the sampler."""
    sampler = extras["sampler"]
    said = f"sampler {sampler} ({extras['sampler_why']})"
    if sampler == "vllm-colocate":  # vLLM's own share of memory, not a cache the planner sizes
        return st, said
    dtype_bytes = 4 if st.precision == "fp32" else 2
    if extras.get("sampler_merged"):  # the merged copies of the adapted weights, kept for the whole run
        merged = shape.targeted_params(st.lora_targets, dense_only=True) * dtype_bytes
        st = dataclasses.replace(st, sampler_merged=float(merged))
        said += f", LoRA merged for generation ({merged / 2**30:.2f} GiB of merged weights)"
    t = cfg.train
    accum = t.batch_size // (world * st.batch) if t.batch_size else t.gradient_accumulation_steps
    seqs = st.batch * (per_generation or max(1, accum))
    kv = kv_cache_bytes(shape, seqs, cfg.data.max_seq_length + completion_tokens, dtype_bytes)
    resident = sampler in ("transformers-static", "compiled")  # a static cache under compiled decoding
    return dataclasses.replace(st, sampler_kv=kv, sampler_kv_resident=resident), said
