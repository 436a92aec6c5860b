"""The sampler in a TRL trainer: the config's generation arguments for the picked sampler (`trl_kwargs`)
and the compiled decoding of the static cache (`CompiledSampler`, a mixin of the trainer class)."""

from __future__ import annotations


# For the objectives that generate (their configs pass it): their batches are prompts, TRL counts the prompt and
# completion tokens into the trainer's state after generating; transformers' own count finds no input_ids there and
# warned at every step.
TOKENS_COUNTED_BY_TRL = {"include_num_input_tokens_seen": "no"}


def trl_kwargs(section, picked: str) -> dict:
    """The TRL config's generation arguments for `picked` (the run's `extras["sampler"]`)."""
    if picked == "auto":
        raise ValueError("generation: auto must be resolved first (generation.sampler.resolve)")
    if picked == "transformers":
        return {"use_vllm": False}
    if picked == "transformers-static":
        return {"use_vllm": False, "cache_implementation": "static"}
    if picked == "transformers-paged":
        return {"use_vllm": False, "use_transformers_continuous_batching": True}
    kw = {"use_vllm": True, "vllm_mode": "colocate"}
    if section.vllm_gpu_memory_utilization is not None:
        kw["vllm_gpu_memory_utilization"] = section.vllm_gpu_memory_utilization
    return kw


class CompiledSampler:
    """generation transformers-static: TRL 1.15 builds its GenerationConfig with `disable_compile=True`
    (its trainers that generate), so its `cache_implementation="static"` alone decodes eagerly
    in a preallocated cache; the compiled decoding is what made the static cache 2.9x-4.5x faster
    (docs/preference.md). Turned back on here; transformers still compiles only on an accelerator. The
    compiled forward reads the parameters the optimizer updates in place, so each generation samples from
    the current policy."""

    def __init__(self, *args, **kw):
        super().__init__(*args, **kw)
        if self.args.cache_implementation == "static" and not self.use_vllm:
            self.generation_config.disable_compile = False


class MergedLora:
    """`sampler_merged` (generation/sampler.py merge): generation runs on W + scale * B @ A. Each of PEFT's
    LoRA linear layers over a plain 16/32-bit nn.Linear gets a buffer, filled once per optimizer step
    (`state.global_step`; a tool loop's turns and steps_per_generation's later steps reuse it), swapped in
    as the base layer's weight with that layer's adapter off while TRL generates, and swapped back after.
    The base weight is never written: PEFT's own merge_adapter/unmerge_adapter subtract the delta again,
    which in bf16 does not give the weight back, and the error would build up step after step. Other
    adapted modules (fused experts, DoRA) keep running their adapters as before. The buffers are the same
    tensors every generation, so a compiled decoding keeps its guards."""

    def _generate_single_turn(self, *args, **kw):
        if self.use_vllm:
            return super()._generate_single_turn(*args, **kw)
        with merged_lora(self):
            return super()._generate_single_turn(*args, **kw)


def mergeable_layers(model) -> list:
    """PEFT's LoRA linear layers of `model` that generation can run merged (one adapter, no DoRA, a plain
    nn.Linear base with a floating-point weight)."""
    import torch
    from peft.tuners.lora import Linear as LoraLinear

    out = []
    for m in model.modules():
        if not isinstance(m, LoraLinear) or len(m.active_adapters) != 1:
            continue
        base, name = m.get_base_layer(), m.active_adapters[0]
        if (type(base) is torch.nn.Linear and base.weight.dtype.is_floating_point and not m.use_dora.get(name)
                and name in m.lora_A):
            out.append(m)
    return out


class merged_lora:
    """The context in which `trainer`'s model generates on merged weights (MergedLora)."""

    def __init__(self, trainer):
        self.t = trainer

    def __enter__(self):
        import torch

        t = self.t
        if getattr(t, "_merged", None) is None:
            layers = mergeable_layers(t.accelerator.unwrap_model(t.model))
            # Parameters (not plain tensors): the base layer's `weight` must stay a Parameter for nn.Linear
            t._merged = [(m, torch.nn.Parameter(torch.empty_like(m.get_base_layer().weight), requires_grad=False))
                         for m in layers]
            t._merged_step = None
        if t._merged_step != t.state.global_step:
            with torch.no_grad():
                for m, buf in t._merged:
                    w = m.get_base_layer().weight
                    torch.add(w, m.get_delta_weight(m.active_adapters[0]).to(w.dtype), out=buf.data)
            t._merged_step = t.state.global_step
        self.kept = []
        for m, buf in t._merged:
            base = m.get_base_layer()
            self.kept.append(base._parameters["weight"])
            base._parameters["weight"] = buf
            m.enable_adapters(False)
        return self

    def __exit__(self, *exc):
        for (m, _), w in zip(self.t._merged, self.kept):
            m.get_base_layer()._parameters["weight"] = w
            m.enable_adapters(True)
        return False


def mixins(extras) -> tuple:
    """The sampler's trainer mixins for a run's extras: the compiled static decoding, the merged LoRA."""
    return (CompiledSampler, *((MergedLora,) if extras.get("sampler_merged") else ()))
