"""The compiled decoding loop (`generation: compiled`): left-padded prompts of a decoder-only causal LM
decoded over transformers' own StaticCache and the model's own forward, without `generate`'s per-token
Python. It owns what the loop can serve (`unsupported`: a generation config; `model_unsupported`: a
model's config, read before it loads) and the loop itself (`Loop`).

One prefill forward (eager) writes the prompts into the cache; then ONE decoding step is the forward of
one token per sequence, TRL's sampling settings (temperature, top_k, top_p, min_p, in generate's order;
argmax when do_sample is off) and the EOS bookkeeping (a finished sequence emits pad, as generate's),
all written into buffers with fixed addresses, so the step compiles whole (fullgraph; on CUDA
mode="reduce-overhead": CUDA graphs). The host asks "all finished?" every CHECK_EVERY tokens, not every
token; the steps run past the last EOS are cut off after, so the result is the (B, P+C) tensor generate
returns. Positions follow the attention mask as generate's (cumsum - 1, pads 0). The cache and buffers
are sized for the first batch (prompt + max_new_tokens, as generate's static cache) and stay; they grow
to a larger batch or length when one comes (the length then by whole 256s: each size is a compile),
and a smaller batch is filled up with copies of its first row, so a tool loop's turns reuse the step.
"""

from __future__ import annotations

CHECK_EVERY = 32  # decoding steps between the host's "all finished?" checks (one sync each)

# generate's logits processors and modes this loop does not implement (GenerationConfig field -> its no-op value)
_NOT_DONE = {"num_beams": 1, "repetition_penalty": 1.0, "encoder_repetition_penalty": 1.0, "no_repeat_ngram_size": 0,
             "encoder_no_repeat_ngram_size": 0, "bad_words_ids": None, "sequence_bias": None, "min_length": 0,
             "min_new_tokens": None, "forced_bos_token_id": None, "forced_eos_token_id": None,
             "suppress_tokens": None, "begin_suppress_tokens": None, "exponential_decay_length_penalty": None,
             "typical_p": 1.0, "epsilon_cutoff": 0.0, "eta_cutoff": 0.0, "top_h": None, "guidance_scale": None,
             "watermarking_config": None, "stop_strings": None, "num_return_sequences": 1, "penalty_alpha": None,
             "dola_layers": None, "assistant_model": None, "prompt_lookup_num_tokens": None,
             "remove_invalid_values": False, "output_scores": False, "output_logits": False,
             "return_dict_in_generate": False, "prefill_chunk_size": None}


def unsupported(gc) -> str | None:
    """Why the loop cannot serve generation config `gc` (as generate would read it), or None."""
    for name, off in _NOT_DONE.items():
        value = getattr(gc, name, off)
        if value not in (off, None) and not (name == "guidance_scale" and value == 1):
            return f"{name} {value!r} (the compiled loop has no {name})"
    if gc.max_new_tokens is None:
        return "no max_new_tokens"
    if gc.use_cache is False:
        return "use_cache off"
    return None


def model_unsupported(config) -> str | None:
    """Why the loop cannot decode a model of `config` (its transformers config, before loading), or None:
    encoder-decoder and vision-language models, a cache with other layers than full attention (sliding
    windows, linear attention), a class transformers does not compile whole (`_can_compile_fullgraph`)."""
    from transformers import StaticCache
    from transformers.cache_utils import StaticLayer
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING

    if getattr(config, "is_encoder_decoder", False):
        return "an encoder-decoder model"
    if getattr(config, "vision_config", None) is not None:
        return "a vision-language model"
    try:
        layers = StaticCache(config=config, max_cache_len=1).layers  # lazy: nothing allocated
    except Exception as exc:  # a model whose config transformers' StaticCache cannot read
        return f"no static cache for it ({type(exc).__name__})"
    if any(type(layer) is not StaticLayer for layer in layers):
        return "its cache has sliding-window or other non-full-attention layers"
    try:
        cls = MODEL_FOR_CAUSAL_LM_MAPPING[type(config)]
    except KeyError:
        return f"{type(config).__name__} is not a transformers causal LM"
    if not getattr(cls, "_can_compile_fullgraph", False):
        return f"transformers does not compile {cls.__name__} whole (_can_compile_fullgraph)"
    return None


class Loop:
    """One model's decoding: its cache, buffers and compiled step. `compile`: torch.compile's arguments
    for the step, None for the default (CUDA: fullgraph, reduce-overhead; elsewhere eager), {} for none."""

    def __init__(self, compile: dict | None = None):
        self.compile, self.shape, self.step = compile, None, None

    def _allocate(self, model, batch: int, length: int, device) -> None:
        import torch
        from transformers import StaticCache

        old = self.shape or (0, 0)
        batch, length = max(batch, old[0]), max(length, old[1])
        if self.shape:  # growing (a tool loop's longer turns): by whole 256s, so a few sizes serve all turns
            length = -(-length // 256) * 256
        self.shape = (batch, length)
        self.cache = StaticCache(config=model.config.get_text_config(decoder=True), max_cache_len=length)
        self.mask = torch.zeros(batch, length, dtype=torch.long, device=device)
        self.tok = torch.zeros(batch, dtype=torch.long, device=device)
        self.pos = torch.zeros(batch, dtype=torch.long, device=device)
        self.alive = torch.zeros(batch, dtype=torch.bool, device=device)
        self.out = torch.zeros(batch, length, dtype=torch.long, device=device)
        self.t = torch.zeros(1, dtype=torch.long, device=device)
        for buf in (self.mask, self.tok, self.pos, self.alive, self.out, self.t):
            torch._dynamo.mark_static_address(buf)  # mutated in place by the compiled step (CUDA graphs)
        args = self.compile
        self.graphs = args is None and torch.device(device).type == "cuda"
        if self.graphs:  # static shapes: a dynamic-shape graph after a second size would be slower, not fewer
            args = {"fullgraph": True, "mode": "reduce-overhead", "dynamic": False}
        self.step = torch.compile(self._step, **args) if args else self._step

    def _choose(self, logits):
        """The next token of each sequence from its last logits (float32), TRL's settings as generate
        applies them: temperature, top_k, top_p, min_p, then a sample; argmax without sampling."""
        import torch

        s = self.settings
        if not s["do_sample"]:
            return logits.argmax(-1)
        if s["temperature"] not in (None, 1.0):
            logits = logits / s["temperature"]
        if s["top_k"]:
            kth = torch.topk(logits, min(s["top_k"], logits.shape[-1]), dim=-1).values[:, -1:]
            logits = logits.masked_fill(logits < kth, float("-inf"))
        if s["top_p"] is not None and s["top_p"] < 1.0:
            ascending, order = torch.sort(logits, dim=-1)
            drop = ascending.softmax(-1).cumsum(-1) <= 1 - s["top_p"]
            drop[:, -1] = False  # the most likely token always stays
            logits = logits.masked_fill(drop.scatter(1, order, drop), float("-inf"))
        if s["min_p"] is not None:
            probs = logits.softmax(-1)
            logits = logits.masked_fill(probs < s["min_p"] * probs.amax(-1, keepdim=True), float("-inf"))
        probs = logits.softmax(-1)
        # a draw from `probs` with no host sync: argmax of p / q, q ~ Exp(1) (the exponential race)
        return (probs / torch.empty_like(probs).exponential_(1)).argmax(-1)

    def _advance(self, logits) -> None:
        """The chosen tokens written at step t; finished sequences emit pad and stay finished."""
        import torch

        nxt = torch.where(self.alive, self._choose(logits.float()), self.pad)
        self.out.index_copy_(1, self.t, nxt[:, None])
        self.alive &= ~torch.isin(nxt, self.eos)
        self.tok.copy_(nxt)
        self.pos.add_(1)
        self.t.add_(1)

    def _step(self, model) -> None:
        logits = model(input_ids=self.tok[:, None], position_ids=self.pos[:, None], attention_mask=self.mask,
                       past_key_values=self.cache, use_cache=True, **self.keep).logits
        self._advance(logits[:, -1])

    def generate(self, model, input_ids, attention_mask, gc):
        """generate's (B, P + C) result for left-padded `input_ids` under generation config `gc` (read
        as generate would read it). `model`: a transformers causal LM (a PEFT model's base model)."""
        import contextlib

        import torch

        gc = model._prepare_generation_config(gc)[0]  # generate's own merge with the model's config
        why = unsupported(gc)
        if why:
            raise ValueError(f"generation: compiled cannot serve this generation config: {why}")
        b, p = input_ids.shape
        c = gc.max_new_tokens
        dev = input_ids.device
        if self.shape is None or b > self.shape[0] or p + c > self.shape[1]:
            self._allocate(model, b, p + c, dev)
        rows, length = self.shape
        eos = gc.eos_token_id if gc.eos_token_id is not None else []
        eos = [eos] if isinstance(eos, int) else list(eos)
        pad = gc.pad_token_id if gc.pad_token_id is not None else (eos[0] if eos else 0)
        self.settings = {k: getattr(gc, k) for k in ("do_sample", "temperature", "top_k", "top_p", "min_p")}
        self.eos = torch.tensor(eos, dtype=torch.long, device=dev)
        self.pad = torch.tensor(pad, dtype=torch.long, device=dev)
        self.keep = {"logits_to_keep": 1} if model._supports_logits_to_keep() else {}
        fill = torch.arange(rows, device=dev)
        fill[b:] = 0
        ids, mask = input_ids[fill], attention_mask[fill].long()  # rows past b: copies of row 0
        self.cache.reset()
        self.mask.fill_(1)
        self.mask[:, :p] = mask  # the completion's columns stay 1: causality hides those not written yet
        self.alive.fill_(True)
        self.t.zero_()
        positions = (mask.cumsum(-1) - 1).masked_fill(mask == 0, 0)
        self.pos.copy_(positions[:, -1])
        with torch.no_grad():
            logits = model(input_ids=ids, position_ids=positions, attention_mask=self.mask, past_key_values=self.cache,
                           use_cache=True, **self.keep).logits
            self._advance(logits[:, -1])
        # generate's switch for decoding (a GPU's MoE experts: batched_mm for one token a sequence)
        optimize = getattr(model, "_optimize_model_for_decode", contextlib.nullcontext)
        with torch.no_grad(), optimize():
            for i in range(1, c):
                if self.graphs:
                    torch.compiler.cudagraph_mark_step_begin()  # each step a new replay of the CUDA graph
                self.step(model)
                if (i + 1) % CHECK_EVERY == 0 and not self.alive[:b].any():
                    break
        out = self.out[:b, :int(self.t)]
        ended = torch.isin(out, self.eos)
        if ended.any(-1).all():  # every sequence ended: generate stopped at the step the last one did
            out = out[:, :int(ended.int().argmax(-1).max()) + 1]
        return torch.cat([input_ids, out], dim=-1)  # a new tensor: the buffer is the next call's
