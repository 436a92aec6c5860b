"""How GRPO generates its completions (`grpo.generation`): transformers' `generate` with its dynamic
cache (TRL's default), the same with a static cache and compiled decoding (`transformers-static`:
GRPOConfig.cache_implementation "static", the compile TRL turns off turned back on by
objectives/grpo/trainer.py), transformers' continuous batching (`transformers-paged`: TRL's
`use_transformers_continuous_batching`), or TRL's vLLM colocate mode (`use_vllm`, `vllm_mode:
colocate`: a vLLM engine in the training process, its share of memory `grpo.vllm_gpu_memory_utilization`).
`auto` picks the fastest this machine runs (`pick`), measured on an H100 (docs/preference.md).

vLLM's PyPI wheels are CUDA builds, each pinned to one torch (vLLM 0.31.0 and 0.32.0: torch==2.13.0,
the cuda stack's; 0.33.0 and 0.34.0: torch==2.14.0); TRL 1.15 declares vLLM 0.21.0-0.31.0 supported
(its `vllm` extra and `is_vllm_available`). `refusal` reads the installed vLLM's own metadata
before the model loads, so a missing or mismatched vLLM is exit 2 and not a crash inside TRL.
"""

from __future__ import annotations

import importlib
from importlib.metadata import PackageNotFoundError, requires, version

VLLM_FOR_TRL = "0.31.0"  # the newest vLLM TRL 1.15 declares supported; the `vllm` extra pins it


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


def refusal(cfg, backend: str, gpu: bool) -> str | None:
    """Why `grpo.generation: vllm-colocate` cannot run here (one line naming the field), or None.
    The installed packages first (what an image fixes), then the machine."""
    if cfg.objective != "grpo" or cfg.grpo.generation != "vllm-colocate":
        return None
    field = "grpo.generation: vllm-colocate"
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
        # Unsloth's patched GRPOTrainer takes the vLLM engine of a model loaded with fast_inference,
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


def pick(cfg, backend: str, gpu: bool) -> tuple[str, str]:
    """The sampler a GRPO run uses, and why: `grpo.generation` as set, or what `auto` resolves to.
    `gpu`: the run (or the machine planned for) trains on a GPU."""
    g = cfg.grpo.generation
    if g != "auto":
        return g, "set in the config"
    if backend == "unsloth":
        # Unsloth's patched trainer generates with its own cache (it passes cache_implementation to generate
        # itself): 2.11 s a step vs 2.05 with the static cache on top, one row each (H100, 2026-12-06,
        # docs/bench/2026-12-06-h100/grpo-unsloth-2/): no compile to wait for, for no measured gain
        return "transformers", ("auto: backend unsloth, its own generation (H100, 2026-12-06: 2.11 s a GRPO step, "
                                "4.4x TRL's default path on hf)")
    if not gpu:
        # transformers compiles decoding only on an accelerator (generate's _valid_auto_compile_criteria):
        # a static cache alone is the dynamic one's work in a preallocated buffer
        return "transformers", "auto: on the CPU transformers compiles no decoding"
    return "transformers-static", ("auto: static cache + compiled decoding (H100, 2026-12-06: 2.9x generate's "
                                   "dynamic cache on llama-1b, 4.5x on qwen3-0.6b)")


def trl_kwargs(g, picked: str | None = None) -> dict:
    """GRPOConfig's generation arguments for the `grpo` section `g` (`picked`: what `auto` resolved to)."""
    picked = picked or g.generation
    if picked == "auto":
        raise ValueError("grpo.generation: auto must be resolved with pick() first")
    if picked == "transformers":
        return {"use_vllm": False}
    if picked == "transformers-static":
        return {"use_vllm": False, "cache_implementation": "static"}
    if picked == "transformers-paged":
        return {"use_vllm": False, "use_transformers_continuous_batching": True}
    kw = {"use_vllm": True, "vllm_mode": "colocate"}
    if g.vllm_gpu_memory_utilization is not None:
        kw["vllm_gpu_memory_utilization"] = g.vllm_gpu_memory_utilization
    return kw


def kv_cache_bytes(shape, sequences: int, tokens: int, dtype_bytes: int) -> float:
    """The sampler's KV cache: `sequences` completions of `tokens` positions each (prompt + completion;
    a static cache allocates the whole length up front), K and V in every layer."""
    return float(sequences * tokens * shape.layers * shape.kv_heads * shape.head_dim * 2 * dtype_bytes)


def with_sampler(cfg, st, shape, backend: str, gpu: bool, world: int) -> tuple:
    """GRPO: the KV cache of the completions each device generates at once (TRL's generation batch:
    per_device_batch_size x steps_per_generation, the groups included), each prompt + completion long."""
    import dataclasses

    sampler, why = pick(cfg, backend, gpu)
    said = f"{sampler} ({why})"
    if sampler == "vllm-colocate":  # vLLM's own share of memory, not a cache the planner sizes
        return st, said
    t, g = cfg.train, cfg.grpo
    accum = t.batch_size // (world * st.batch) if t.batch_size else t.gradient_accumulation_steps
    seqs = st.batch * (g.steps_per_generation or max(1, accum))
    kv = kv_cache_bytes(shape, seqs, cfg.data.max_seq_length + g.max_completion_length,
                        4 if st.precision == "fp32" else 2)
    return dataclasses.replace(st, sampler_kv=kv, sampler_kv_resident=sampler == "transformers-static"), said
