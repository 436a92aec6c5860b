"""The sampler in a TRL trainer: the config's generation arguments for the picked sampler (`trl_kwargs`),
the compiled decoding of the static cache (`CompiledSampler`), the Toolbox's compiled loop (`CompiledLoop`)
and the merged-LoRA generation (`MergedLora`), mixins of the trainer class."""

from __future__ import annotations


# For the objectives that generate (their configs pass it): their batches are prompts, TRL counts the prompt and
# completion tokens into the trainer's state after generating; transformers' own count finds no input_ids there and
# warned at every step.
TOKENS_COUNTED_BY_TRL = {"include_num_input_tokens_seen": "no"}


def trl_kwargs(section, picked: str) -> dict:
    """The TRL config's generation arguments for `picked` (the run's `extras["sampler"]`)."""
    if picked == "auto":
        raise ValueError("generation: auto must be resolved first (generation.sampler.resolve)")
    if picked in ("transformers", "compiled"):  # compiled: CompiledLoop replaces TRL's call of generate
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


class CompiledLoop:
    """generation compiled: TRL's plain transformers path of `_generate_single_turn` (its tool loop calls it
    each turn) decoded by the Toolbox's loop (generation/decode.py) instead of `generate`, under the same
    block name of TRL's profiler ("transformers.generate"), the model unwrapped as TRL unwraps it. Its
    result is TRL's: each completion up to its first EOS (GRPO's variant, which takes `num_generations`,
    with logprobs None beside it). A run the loop cannot serve was refused when it was resolved
    (generation/sampler.py compiled_refusal); what still turns up here that it cannot serve (images, a
    generation config changed since) stops the run with the reason, never a silent switch."""

    def __init__(self, *args, **kw):
        import inspect

        super().__init__(*args, **kw)
        from toolbox_train.generation.decode import Loop

        self._loop = Loop()
        self._turn_has_logprobs = "num_generations" in inspect.signature(super()._generate_single_turn).parameters

    def _generate_single_turn(self, prompt_ids, images, multimodal_fields, *args, **kw):
        import torch
        from trl.extras.profiling import profiling_context
        from trl.models.utils import unwrap_model_for_generation

        if images is not None and any(i is not None for i in images) or multimodal_fields or kw.get("has_tool_images"):
            raise RuntimeError("generation: compiled decodes text prompts only and this batch has images; "
                               "set generation: transformers-static")
        device = self.accelerator.device
        pad = self._tokenizer.pad_token_id  # TRL's trainers set it (the eos where the tokenizer has no pad)
        width = max(len(p) for p in prompt_ids)
        ids = torch.tensor([[pad] * (width - len(p)) + list(p) for p in prompt_ids], device=device)
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompt_ids], device=device)
        with (profiling_context(self, "transformers.generate"),
              unwrap_model_for_generation(self.model_wrapped, self.accelerator,
                                          gather_deepspeed3_params=self.args.ds3_gather_for_generation,
                                          generation_kwargs=self.generation_kwargs) as unwrapped,
              torch.no_grad()):
            model = unwrapped.get_base_model() if hasattr(unwrapped, "get_base_model") else unwrapped
            out = self._loop.generate(model, ids, mask, self.generation_config)[:, width:].cpu()
        eos = set(self.eos_token_ids)
        completions = []
        for row in out.tolist():
            end = next((i for i, t in enumerate(row) if t in eos), len(row) - 1)
            completions.append(row[:end + 1])
        return (completions, None) if self._turn_has_logprobs else completions


def mixins(extras) -> tuple:
    """The sampler's trainer mixins for a run's extras: the compiled static decoding (or the compiled loop),
    the merged LoRA (outside the loop: the loop decodes on the merged weights)."""
    merged = (MergedLora,) if extras.get("sampler_merged") else ()
    if extras.get("sampler") == "compiled":
        return (*merged, CompiledLoop)
    return (CompiledSampler, *merged)
