"""Memory planner: peak device memory of a training setting, from the model's config.json alone.

No weights are loaded, so it plans a 27B model on a laptop. The model is first-principles
arithmetic (what autograd keeps for backward, what the optimizer holds) with a handful of
constants calibrated on an H200 (docs/benchmarks.md, "Memory planner"); the CPU tests
check the arithmetic against the tiny models' real parameter counts and saved tensors.

    peak = weights + optimizer states + max(forward end, backward tail, optimizer step) + overhead

Kernels: `hf` (plain transformers, model's own loss over full fp32 logits), `liger` (Liger's
RMSNorm/SwiGLU/RoPE), `unsloth` (Unsloth's kernels, its offloaded checkpointing keeps layer
inputs in host memory). The LM head is `full` (HF's loss) or `chunked` (TRL's fused head,
Liger's fused linear cross-entropy, Unsloth's loss): no full logits.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Mapping

from toolbox_train.models.families import LORA_ALL_LINEAR, family
from toolbox_train.sizes import parse_size  # noqa: F401 (re-exported: the memory plan's device sizes)
from toolbox_train.models.tower import Tower, tower as vision_tower

GiB = 2**30

# Calibrated on one H200 (docs/benchmarks.md): how many layers' working sets are alive at the
# worst point of backward on top of what is saved (recompute + its gradients), and per backend.
CAL = {
    "bwd_layers": {"hf": 1.5, "liger": 1.5, "unsloth": 1.0},
    # Unsloth's kernels keep less than Liger's per layer (llama-1b LoRA without checkpointing)
    "unsloth_layer_factor": 0.84,
    # Unsloth's offloaded checkpointing: its working set on the device, in layers
    "unsloth_offload_layers": 2.08,
    # PEFT LoRA on the HF path keeps a copy of down_proj's input per layer (bytes per intermediate
    # element; llama-1b and gemma3-1b without checkpointing)
    "hf_lora_extra_per_i": 2.0,
    # bitsandbytes LLM.int8 layers keep their own copies of each wrapped linear's input (bytes per
    # input element; one configuration, llama-1b lora-8bit)
    "int8_extra_per_input": 1.5,
    "overhead_gib": 0.25,  # cuBLAS workspaces, allocator rounding, small buffers
    # TRL 1.15's ORPOTrainer (trl.experimental) builds the model's bf16 logits for chosen + rejected in one
    # forward, bytes per logit at the start of backward: the logits (2), selective_log_softmax's per-row
    # bf16 log-probabilities (2), the chosen half's NLL log-softmax (1), the logits' bf16 gradient (2) and the
    # chosen half's log-softmax gradient (1). llama-1b LoRA, H200, 2026-12-06: 26.6 GiB measured
    "logits_bytes": 8.0,
    # Unsloth builds a frozen vision tower's graph (each block's activations were live at its peak) and keeps this
    # share of what a training tower's blocks keep (models/tower.py): the factor that puts the plan on the
    # measured peak is 0.63 on gemma3-4b-4l (SigLIP, 4 x 896 px) and 0.52 on qwen2.5-vl-7b-4l (4 x 448 px), H100,
    # 2026-12-07 (docs/bench/2026-12-07-h100-vision2); one factor for both
    "unsloth_frozen_tower": 0.58,
}
TRL_TOKEN_CHUNK, TRL_VOCAB_CHUNK = 4096, 32768  # trl/kernels/chunked_logprob.py (TRL 1.15)
def expert_targets(model_type: str, targets: tuple[str, ...] | list[str] | str = "all-linear") -> list[str]:
    """The expert parameters LoRA adapts through PEFT's `target_parameters`, for these target modules: a fused-expert
    MoE family's (families.Family.fused_experts: its experts are 3-D nn.Parameters, not nn.Linear modules)."""
    names = LORA_ALL_LINEAR if targets == "all-linear" else tuple(targets)
    return [param for param, mlp in family(model_type).fused_experts if any(n in names for n in mlp)]


def moe_experts(cfg: Mapping[str, Any] | Any) -> int:
    """Experts per layer of a config.json dict or a transformers config (its text part); 0: a dense MLP."""
    d = cfg if isinstance(cfg, Mapping) else cfg.to_dict()
    text = d.get("text_config") or d
    return text.get("num_local_experts") or text.get("num_experts") or 0


@dataclass(frozen=True)
class Shape:
    """The numbers of a (text) decoder that memory depends on."""

    model_type: str
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    tied: bool = True
    qk_norm: bool = False
    norms_per_layer: int = 2
    attention_bias: bool = False
    experts: int = 0  # MoE: experts per layer (0: dense MLP)
    experts_per_token: int = 0
    max_position: int | None = None
    extra_params: int = 0  # parts outside the text decoder (a vision tower and its projector), frozen unless trained
    tower: Tower | None = None  # the vision tower and projector of a vision-language model (models/tower.py)
    sliding_window: int = 0
    name: str = ""

    @classmethod
    def from_config(cls, cfg: Mapping[str, Any] | Any, name: str = "") -> "Shape":
        """From a config.json dict (or a transformers config); multimodal wrappers use their text part."""
        d = cfg if isinstance(cfg, Mapping) else cfg.to_dict()
        text = d.get("text_config") or d
        vision = d.get("vision_config")
        mt = text.get("model_type") or d.get("model_type", "")
        fam = family(mt)
        h, nh = text["hidden_size"], text["num_attention_heads"]
        experts = moe_experts(text)
        return cls(
            model_type=mt, hidden=h, layers=text["num_hidden_layers"], heads=nh,
            kv_heads=text.get("num_key_value_heads") or nh, head_dim=text.get("head_dim") or h // nh,
            intermediate=text.get("moe_intermediate_size") if experts and text.get("moe_intermediate_size")
            else text["intermediate_size"],
            vocab=text["vocab_size"],
            tied=bool(d.get("tie_word_embeddings", text.get("tie_word_embeddings", False))),
            qk_norm=fam.qk_norm, norms_per_layer=fam.norms_per_layer,
            attention_bias=bool(text.get("attention_bias", False)),
            experts=experts, experts_per_token=text.get("num_experts_per_tok") or text.get("experts_per_token") or 0,
            max_position=text.get("max_position_embeddings"),
            extra_params=vision_params(vision, h, d.get("model_type")) if vision else 0,
            tower=vision_tower(vision, h, d.get("model_type")) if vision else None,
            sliding_window=text.get("sliding_window") or 0, name=name,
        )

    @property
    def q(self) -> int:
        return self.heads * self.head_dim

    @property
    def kv(self) -> int:
        return self.kv_heads * self.head_dim

    def linear_shapes(self) -> dict[str, tuple[int, int, int]]:
        """Per layer: name -> (in, out, copies), the matrices LoRA/quantization act on."""
        h, i = self.hidden, self.intermediate
        s = {"q_proj": (h, self.q, 1), "k_proj": (h, self.kv, 1), "v_proj": (h, self.kv, 1),
             "o_proj": (self.q, h, 1)}
        if self.experts:
            s.update(experts_gate_up=(h, 2 * i, self.experts), experts_down=(i, h, self.experts))
        else:
            s.update(gate_proj=(h, i, 1), up_proj=(h, i, 1), down_proj=(i, h, 1))
        return s

    def params(self) -> dict[str, int]:
        """Parameter counts by part (matches transformers' modules; biases where the family has them)."""
        h, L = self.hidden, self.layers
        lin = sum(a * b * c for a, b, c in self.linear_shapes().values())
        bias = (self.q + 2 * self.kv + h) * self.attention_bias
        if self.experts:  # GPT-OSS style: expert biases, a router with bias, attention sinks
            bias += self.experts * (2 * self.intermediate + h) + self.experts * (h + 1) + self.heads
        norms = self.norms_per_layer * h + (2 * self.head_dim if self.qk_norm else 0)
        embed = self.vocab * h
        return {"embed": embed, "lm_head": 0 if self.tied else embed, "layers_linear": L * lin,
                "layers_other": L * (bias + norms), "final_norm": h, "extra": self.extra_params}

    def n_params(self) -> int:
        return sum(self.params().values())

    def lora_params(self, r: int, targets: tuple[str, ...] | str = "all-linear") -> int:
        """Adapter parameters: r x (in + out) per matrix; a fused expert parameter (FUSED_EXPERTS) gets one
        r-rank pair per expert (PEFT's ParamWrapper: lora_A [r * experts, in], lora_B [out, r * experts])."""
        return self.layers * sum(r * (a + b) * c for a, b, c in self._adapted(targets))

    def targeted_params(self, targets: tuple[str, ...] | str = "all-linear", dense_only: bool = False) -> int:
        """The base weights the adapters sit on (`dense_only`: the linear layers, not fused experts)."""
        return self.layers * sum(a * b * c for a, b, c in self._adapted(targets, dense_only))

    def _adapted(self, targets, dense_only: bool = False) -> list[tuple[int, int, int]]:
        names = LORA_ALL_LINEAR if targets == "all-linear" else tuple(targets)
        experts = {p.rpartition(".")[2] for p in expert_targets(self.model_type, targets)} \
            if self.experts and not dense_only else set()
        return [v for n, v in self.linear_shapes().items() if n in names
                or (n.startswith("experts_") and n.replace("experts_", "", 1) + "_proj" in experts)]


def vision_params(v: Mapping[str, Any], text_hidden: int, model_type: str | None = None) -> int:
    """A vision tower plus the projector into the text model (models/tower.py)."""
    t = vision_tower(v, text_hidden, model_type)
    return t.params + t.projector


@dataclass
class Setting:
    method: str = "lora"  # full | lora | qlora | lora-8bit
    backend: str = "hf"  # hf | unsloth
    liger: bool = False
    gradient_checkpointing: bool | str = True  # True | False | "unsloth" (offloaded)
    batch: int = 1
    seq: int = 2048
    precision: str = "bf16"
    optimizer: str = "adamw_torch"
    lora_r: int = 16
    lora_targets: tuple[str, ...] | str = "all-linear"
    head: str = "chunked"  # chunked (TRL/Liger/Unsloth) | full (the model's own loss) | logits (ORPO's bf16 logits)
    world_size: int = 1
    strategy: str = "single"  # single | ddp | fsdp
    unified_memory: bool = False  # APU: host offload takes the same memory
    reference_copy: bool = False  # DPO/KTO full fine-tuning: a frozen copy of the model beside it
    lora_params: int | None = None  # the adapter's size as PEFT built it; None: Shape.lora_params's count
    sampler_kv: float = 0.0  # bytes of the sampler's KV cache (generation/sampler.py kv_cache_bytes)
    sampler_kv_resident: bool = False  # a static cache under compiled decoding: counted through the whole step
    sampler_merged: float = 0.0  # bytes of the merged LoRA weights the sampler keeps (generation/trainer.py)
    teacher_bytes: float = 0.0  # a frozen teacher model's weights beside the trained one (held through the step)
    vision_train: tuple[str, ...] = ()  # a vision-language model's vision.train (language, vision, projector)
    patches_per_row: int = 0  # patches a row's images give the tower (image rows; 0 for text rows)

    @property
    def kernels(self) -> str:
        return "unsloth" if self.backend == "unsloth" else "liger" if self.liger else "hf"

    @property
    def gc(self) -> str:
        g = self.gradient_checkpointing
        if not g:
            return "off"
        return "offload" if self.backend == "unsloth" else "on"

    def label(self) -> str:
        gc = {"off": "no ckpt", "on": "ckpt", "offload": "offloaded ckpt"}[self.gc]
        extra = f", {self.strategy} x{self.world_size}" if self.world_size > 1 else ""
        extra += f", {self.optimizer}" if "8bit" in self.optimizer else ""
        extra += " +reference copy" if self.reference_copy else ""
        return f"{self.method} {self.kernels} {gc} b{self.batch} s{self.seq}{extra}"


@dataclass
class Estimate:
    setting: Setting
    parts: dict[str, float]  # bytes per device
    peak: float
    host: float = 0.0  # pinned host memory (Unsloth's offloaded layer inputs)
    where: str = ""  # which phase sets the peak

    @property
    def peak_gib(self) -> float:
        return self.peak / GiB


def _bytes(precision: str) -> int:
    return 4 if precision == "fp32" else 2


def layer_bytes(s: Shape, kernels: str, e: int = 2) -> float:
    """Bytes autograd keeps per token for one decoder layer (no checkpointing).

    hf: HF's RMSNorm keeps an fp32 copy of its input and its bf16 output (Gemma's two fp32
    tensors); the MLP keeps gate, act(gate), up and their product. liger: its RMSNorm keeps only
    the bf16 input, its SwiGLU/GeGLU the two inputs. Attention (sdpa, flash/efficient kernel):
    rotated q and k, v, the output, and the contiguous copy o_proj reads.
    """
    h, q, kv, i = s.hidden, s.q, s.kv, s.intermediate
    f = 4  # fp32
    if kernels == "hf":
        norm = 2 * f if family(s.model_type).fp32_norms else f + e  # per element of the normed tensor
        norms = s.norms_per_layer * h * norm
        qk = (q + kv) * norm if s.qk_norm else 0
        mlp = 4 * i * e
    else:  # liger and unsloth: fused norm/activation kernels keep their inputs only
        norms = s.norms_per_layer * h * e
        qk = (q + kv) * e if s.qk_norm else 0
        mlp = 3 * i * e
    if s.experts:
        mlp *= max(1, s.experts_per_token)
    linear_inputs = 2 * h * e  # normed input of q/k/v (shared) and of gate/up (shared)
    attention = (3 * q + 2 * kv) * e  # q_rot, k_rot, v, out (+ lse, tiny), contiguous copy for o_proj
    return norms + qk + linear_inputs + attention + mlp


def head_bytes(s: Shape, st: Setting, tokens: int, trainable_head: bool) -> float:
    """The LM head and loss at their worst (start of backward), bytes."""
    V, h = s.vocab, s.hidden
    if st.head == "logits":  # the loss reads the model's logits itself (TRL's ORPO): CAL["logits_bytes"]
        return tokens * V * CAL["logits_bytes"] + tokens * h * 2  # + the hidden states' bf16 gradient
    if st.head == "full":  # the model's own loss: its logits (kept by the output), their fp32 log-softmax and
        # the fp32 gradient at the start of backward (Gemma 3 image batches, H100 2026-12-07: two fp32 and
        # one bf16 [tokens x vocab] tensors live at the peak)
        return tokens * V * (_bytes(st.precision) + 4 + 4)
    if st.backend == "unsloth":
        return tokens * h * 4  # Unsloth's loss: chunked logits; its fp32 gradient of the hidden states
    # TRL's fused head: one bf16 [4096 x 32768] projection tile, fp32 gradients of the hidden
    # states and (full fine-tuning) of the head's weight
    tile = min(tokens, TRL_TOKEN_CHUNK) * min(V, TRL_VOCAB_CHUNK) * 2
    return tile + tokens * h * 4 + (V * h * 4 if trainable_head else 0)


def estimate(s: Shape, st: Setting) -> Estimate:
    e = _bytes(st.precision)
    p = s.params()
    n = s.n_params()
    world = max(1, st.world_size)
    tokens = st.batch * st.seq
    parts: dict[str, float] = {}
    # -- weights
    if st.method in ("qlora", "lora-8bit"):
        lin = p["layers_linear"]
        if s.tower is not None and st.backend != "unsloth":  # bitsandbytes quantizes the tower's Linear layers
            lin += s.tower.linear  # too; Unsloth leaves the tower in 16 bits (H100 2026-12-07: its QLoRA saved the
            # text layers' share alone, and the HF rows' weights were the tower's quantized)
        per = 0.5 + 1 / 64 + 4 / (64 * 256) if st.method == "qlora" else 1 + 4 / s.hidden
        parts["weights"] = lin * per + (n - lin) * e
    else:
        parts["weights"] = n * e
    if st.reference_copy:  # frozen, in the training precision; FSDP shards it like the model
        parts["reference_model"] = n * e / (world if st.strategy == "fsdp" else 1)
    if st.teacher_bytes:  # its forward runs under no_grad: its weights are what it keeps
        parts["teacher_model"] = st.teacher_bytes / (world if st.strategy == "fsdp" else 1)
    # -- trainable parameters: grads, optimizer states, optimizer step temporaries
    frozen = s.extra_params  # the tower and projector, unless vision.train names them
    if s.tower is not None:
        frozen -= s.tower.params * ("vision" in st.vision_train) + s.tower.projector * ("projector" in st.vision_train)
    if st.method == "full":
        trainable, tb = n - frozen, e
    else:
        trainable = st.lora_params if st.lora_params is not None else s.lora_params(st.lora_r, st.lora_targets)
        # PEFT upcasts adapters to fp32 (bf16 base); TRL keeps QLoRA adapters in bf16
        tb = 4 if st.method == "lora" and st.backend == "hf" else e
        parts["weights"] += trainable * tb
    opt = st.optimizer.lower()
    state_b = 2 if "8bit" in opt else 0 if opt.startswith("sgd") else tb * (1 if "lion" in opt else 2)
    if "adafactor" in opt:
        state_b = 0.1 * tb
    grads, states = trainable * tb, trainable * state_b
    temp = trainable * tb if (opt in ("adamw_torch", "adamw") or opt.startswith("adamw_torch") and "fused" not in opt) else 0
    if st.strategy == "fsdp":
        # accelerate's FSDP2 keeps fp32 sharded parameters (mixed precision computes in bf16)
        master = trainable * 4
        parts["weights"] = (parts["weights"] - (trainable * e if st.method == "full" else 0) + master) / world
        grads, states, temp = trainable * 4 / world, trainable * 8 / world, trainable * 4 / world
        per_layer = (p["layers_linear"] + p["layers_other"]) / s.layers
        parts["gathered_layers"] = 2 * per_layer * e  # the unit in flight and the prefetched one
    elif st.strategy == "ddp" and world > 1:
        parts["ddp_buckets"] = grads  # reducer buckets, a copy of the gradients
    parts["optimizer_states"] = states
    # -- activations
    k = st.kernels
    per_tok = layer_bytes(s, k, e) * (CAL["unsloth_layer_factor"] if k == "unsloth" else 1)
    if family(s.model_type).eager_attention and k != "unsloth":
        # transformers' GPT-OSS has no sdpa (attention sinks): eager attention keeps the [s, s+1]
        # scores per head (fp32 softmax output and its bf16 copy); not calibrated on a GPU
        per_tok += s.heads * st.seq * (4 + 2)
    if st.method == "lora" and k != "unsloth":  # PEFT's fp32 adapters
        per_tok += CAL["hf_lora_extra_per_i"] * s.intermediate * max(1, s.experts_per_token)
    lb = per_tok * tokens
    # bitsandbytes' int8 matmul keeps its state on the autograd context, outside save_for_backward,
    # so checkpointing does not free it: every layer's stays until backward
    int8 = (CAL["int8_extra_per_input"] * sum(a * c for a, b, c in s.linear_shapes().values()) * tokens
            * s.layers if st.method == "lora-8bit" and k != "unsloth" else 0)
    boundary = s.hidden * e * tokens  # one layer's input
    host = 0.0
    # sliding-window layers under HF's sdpa get an explicit bf16 mask [b, 1, s, s], kept once for all
    kept = int8 + (st.batch * st.seq * st.seq * 2 if s.sliding_window and k != "unsloth" else 0)
    # A training tower keeps its blocks' working sets for backward; a frozen one runs without a graph, except
    # under Unsloth, which keeps part of it (CAL["unsloth_frozen_tower"])
    tower = s.tower.activation_bytes(st.patches_per_row * st.batch, e, st.gc != "off") if s.tower is not None else 0
    if "vision" not in st.vision_train:
        tower *= CAL["unsloth_frozen_tower"] if k == "unsloth" else 0
    if st.gc == "off":
        saved = s.layers * lb + kept
        tail = CAL["bwd_layers"][k] * lb + kept
    elif st.gc == "on":  # each layer's input kept; one layer recomputed at a time in backward
        saved = s.layers * boundary + kept
        tail = CAL["bwd_layers"][k] * lb + s.layers * boundary + kept
    else:  # Unsloth offloads each layer's input to host memory and recomputes the layer
        saved = CAL["unsloth_offload_layers"] * lb + boundary
        tail = saved
        host = s.layers * boundary
    saved, tail = saved + tower, tail + tower  # the tower's backward comes last: kept through the whole of it
    head = head_bytes(s, st, tokens, trainable_head=st.method == "full")
    emb = 2 * s.hidden * e * tokens  # embedding output and final norm
    fwd_end = saved + head + emb
    # backward: recomputed layer + its gradients; gradients accumulate as saved tensors go
    bwd_tail = max(tail, grads + CAL["bwd_layers"][k] * lb) + parts.get("ddp_buckets", 0)
    step = grads + temp + parts.get("ddp_buckets", 0)
    phases = {"forward/backward": fwd_end, "end of backward": bwd_tail, "optimizer step": step}
    if st.sampler_kv:  # GRPO's generation: its KV cache, then freed (or kept: sampler_kv_resident)
        parts["sampler_kv_cache"] = st.sampler_kv
        if st.sampler_kv_resident:
            phases = {k: v + st.sampler_kv for k, v in phases.items()}
        phases["generation"] = st.sampler_kv
    where = max(phases, key=phases.get)
    parts["activations_peak"] = fwd_end
    if tower:
        parts["vision_tower_activations"] = tower
    parts["grads"] = grads
    parts["step_temp"] = temp
    parts["overhead"] = CAL["overhead_gib"] * GiB
    if st.sampler_merged:
        parts["sampler_merged_weights"] = st.sampler_merged
    peak = (parts["weights"] + parts.get("reference_model", 0) + parts.get("teacher_model", 0) + states
            + st.sampler_merged
            + parts.get("gathered_layers", 0) + phases[where] + parts["overhead"])
    if st.unified_memory:
        peak += host
    return Estimate(dataclasses.replace(st), parts, peak, host, where)
