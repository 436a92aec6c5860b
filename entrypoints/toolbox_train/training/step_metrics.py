"""The SFT trainer's per-step metrics without a host sync per step (issue 26), and without the ones
nothing here reads.

TRL's SFTTrainer reads its entropy, token accuracy and token count back to the host after every
forward (`.item()`), and transformers its token count after every backward: each read stops the
host until the device has caught up, so the kernels that follow start from an empty queue (on a
small model, whose steps are short, the GPU then waits for the host). The entropy and the top-1
accuracy are also work on the device: TRL 1.15 asks its fused LM head for them on every forward
(`add_fused_lm_head(..., outputs=("log_probs", "entropy", "is_top1"))`), and its kernel (or, under
Unsloth, unsloth_zoo's `fused_linear_logprobs`) folds them into its pass over each vocabulary tile.
`output.step_metrics`:

- `loss` (the default): the head computes the log-probabilities alone, no entropy or accuracy is
  computed or logged; the token counts are summed on the device and read at log steps.
- `deferred`: TRL's entropy and accuracy too, summed on the device and read at log steps.
- `synced`: TRL's and transformers' own per-step code.

Only the training loss of SFT with `loss_type: nll` on TRL's fused head (a GPU) takes the first two;
evaluation and the other losses run TRL's compute_loss, which logs its entropy and accuracy.

That loss also leaves out TRL's boolean-mask gather of the labelled positions (`train.lm_head_tokens:
all`, sync_free_head): a mask index syncs in the forward and in its backward; tests/train/test_host_syncs.py
counts what a step still syncs.
"""

from __future__ import annotations

import contextlib

from toolbox_train.planning.heads import liger_chunk_mem_const

LOSS_ONLY_DROPS = ("entropy", "is_top1")  # the fused head's outputs that only feed TRL's metrics


@contextlib.contextmanager
def loss_only_head():
    """TRL's fused head asks its kernel for the log-probabilities alone while inside (the outputs tuple
    is fixed when TRL patches the model, so the kernel TRL looks up at each call is wrapped here)."""
    from trl.trainer import utils

    kernel = utils._ChunkedLogProbFunction

    class LogProbsOnly:
        @staticmethod
        def apply(*args):
            args = list(args)
            if len(args) > 8:  # TRL 1.15: (hidden, weight, bias, targets, temperature, chunk, softcap, scale, outputs)
                args[8] = tuple(o for o in args[8] if o not in LOSS_ONLY_DROPS)
            return kernel.apply(*args)

    utils._ChunkedLogProbFunction = LogProbsOnly
    try:
        yield
    finally:
        utils._ChunkedLogProbFunction = kernel


# What TRL 1.15's add_fused_lm_head closes its forward over (read back, so that the model-specific logit
# scale and softcap are TRL's own and not a copy that could drift from it).
_TRL_HEAD_CELLS = frozenset({"backbone_attr", "temperature", "cast_lm_head_to_fp32", "final_logit_softcapping",
                             "logit_scale", "text_config", "outputs"})


def trl_head_settings(module) -> dict | None:
    """The settings of TRL's fused forward patched onto `module` (an instance attribute), or None."""
    fn = getattr(module.__dict__.get("forward"), "__func__", None)
    code = getattr(fn, "__code__", None)
    if code is None or code.co_name != "_fused_forward" or not fn.__closure__:
        return None
    try:
        cells = {k: c.cell_contents for k, c in zip(code.co_freevars, fn.__closure__)}
    except ValueError:  # an empty cell
        return None
    return cells if _TRL_HEAD_CELLS <= cells.keys() else None


def _hidden_states(model, cfg: dict, head, args, labels, shift_labels, kw):
    """The backbone's last hidden states and the labels they predict (shifted, unless TRL passed
    shift_labels), on the head's device, the mask of the labelled positions, and the MoE router's
    load-balancing loss where the config asks for router logits (else None)."""
    kw["use_cache"] = False
    if getattr(cfg["text_config"], "output_router_logits", False):
        kw.setdefault("output_router_logits", True)  # as TRL's fused forward and the model's own do
    out = getattr(model, cfg["backbone_attr"])(*args, **kw)
    hidden = out.last_hidden_state
    if shift_labels is None:
        hidden, labels = hidden[:, :-1], labels[:, 1:]
    else:
        labels = shift_labels
    hidden, labels = hidden.to(head.weight.device), labels.to(head.weight.device)
    aux = None
    if kw.get("output_router_logits"):
        # Mixtral's function, which every MoE family shares (TRL's fused forward takes the same)
        from transformers.models.mixtral.modeling_mixtral import load_balancing_loss_func

        tc = cfg["text_config"]
        aux = load_balancing_loss_func(out.router_logits, tc.num_experts, tc.num_experts_per_tok, kw.get("attention_mask"))
    return hidden, labels, labels != -100, aux


def all_positions_forward(trl_forward, cfg: dict):
    """TRL's fused-head forward without its boolean-mask gather (`hidden_states[mask]`, `labels[mask]`):
    a mask index has a data-dependent size, so it reads the mask's count back to the host (a sync) in the
    forward and again in its backward (index_put). Here every position goes through the head, the
    unlabelled ones with target 0, and their outputs are zeroed (torch.where: no gradient reaches them):
    the same per-token outputs, loss and gradients, and no sync. `loss` is the NLL alone; an MoE router's
    load-balancing loss comes beside it (aux_loss), weighted by fused_nll_deferred as TRL's compute_loss
    does. FSDP2's DTensor head takes TRL's forward."""

    def forward(self, *args, fused_lm_head=False, labels=None, shift_labels=None, num_items_in_batch=None, **kw):
        import torch
        from torch.distributed.tensor import DTensor
        from trl.trainer import utils

        head = self.get_output_embeddings()
        if not fused_lm_head or isinstance(head.weight, DTensor):
            return trl_forward(*args, fused_lm_head=fused_lm_head, labels=labels, shift_labels=shift_labels,
                               num_items_in_batch=num_items_in_batch, **kw)
        hidden, labels, mask, aux = _hidden_states(self, cfg, head, args, labels, shift_labels, kw)
        autocast = contextlib.nullcontext()
        if cfg["cast_lm_head_to_fp32"]:
            hidden = hidden.float()
            autocast = torch.autocast(hidden.device.type, enabled=False)
        with autocast, utils.maybe_gather_lm_head_ctx(head.weight, head.bias):
            per_token = utils._ChunkedLogProbFunction.apply(
                hidden.reshape(-1, hidden.size(-1)), head.weight, head.bias, labels.masked_fill(~mask, 0).reshape(-1),
                cfg["temperature"], utils._CHUNKED_LOGPROB_CHUNK_SIZE, cfg["final_logit_softcapping"],
                cfg["logit_scale"], cfg["outputs"])
        log_probs, entropy, sq, mean, top1 = (
            None if x is None else torch.where(mask, x.view(mask.shape), x.new_zeros(())) for x in per_token)
        n = mask.sum().clamp(min=1) if num_items_in_batch is None else num_items_in_batch
        return utils.FusedCausalLMOutput(loss=-log_probs.sum() / n, log_probs=log_probs, entropy=entropy,
                                         log_sum_sq_probs=sq, mean_logits=mean, is_top1=top1, label_mask=mask,
                                         aux_loss=aux)

    return forward


def liger_head_forward(trl_forward, cfg: dict):
    """TRL's fused forward with the loss on Liger's fused linear cross-entropy (`train.lm_head_kernel: liger`):
    every position through the head (no mask gather, as all_positions_forward), the gradients of the hidden
    states computed in Liger's forward, so backward does not recompute the logits as TRL's kernel does (the
    bare loops' Liger head). Returns FusedCausalLMOutput with the loss alone (log_probs None): no entropy or
    top-1, so only with `output.step_metrics: loss`. An MoE router's loss comes beside (aux_loss), as in
    all_positions_forward. FSDP2's DTensor head, an fp32 head, a temperature or logit scale take TRL's forward."""
    chunk: list[int] = []  # Liger's chunk budget for this model, read from Liger's module at the first call

    def forward(self, *args, fused_lm_head=False, labels=None, shift_labels=None, num_items_in_batch=None, **kw):
        from torch.distributed.tensor import DTensor
        from trl.trainer import utils

        head = self.get_output_embeddings()
        if (not fused_lm_head or isinstance(head.weight, DTensor) or cfg["cast_lm_head_to_fp32"]
                or cfg["temperature"] != 1 or cfg["logit_scale"] != 1):
            return trl_forward(*args, fused_lm_head=fused_lm_head, labels=labels, shift_labels=shift_labels,
                               num_items_in_batch=num_items_in_batch, **kw)
        hidden, labels, mask, aux = _hidden_states(self, cfg, head, args, labels, shift_labels, kw)
        n = mask.sum().clamp(min=1) if num_items_in_batch is None else num_items_in_batch
        if not chunk:
            chunk.append(liger_chunk_mem_const(cfg["text_config"]))
        total = LIGER_FLCE[0](hidden.reshape(-1, hidden.size(-1)), head.weight, labels.reshape(-1), bias=head.bias,
                              ignore_index=-100, reduction="sum", softcap=cfg["final_logit_softcapping"],
                              **({"chunk_mem_const": chunk[0]} if chunk[0] != 1 else {}))
        return utils.FusedCausalLMOutput(loss=total / n, label_mask=mask, aux_loss=aux)

    return forward


def _liger_flce(*args, **kw):
    from liger_kernel.transformers.functional import liger_fused_linear_cross_entropy

    return liger_fused_linear_cross_entropy(*args, **kw)


LIGER_FLCE = [_liger_flce]  # Liger's function, looked up at the call (a list: one place a CPU test swaps it)


_HEAD_WAY = "_toolbox_head_way"  # on the switched module: None (TRL's forward), "all" or "liger"


def install_head_switch(model):
    """Put a switch over TRL 1.15's fused forward on the module of `model` that carries it (under PEFT), and
    return that module (None: not TRL 1.15's forward - another TRL, or a backend's own head). Done when the
    trainer is built, before accelerate prepares the model: in mixed precision accelerate wraps the prepared
    module's own forward in autocast (full fine-tuning: the module TRL patched), and a forward swapped in
    later would run outside that wrapper; the switch is inside it and only reads which head to run."""
    import types

    owner, cfg = next(((m, c) for m in model.modules() if (c := trl_head_settings(m)) is not None), (None, None))
    if owner is None:
        return None
    trl_forward = owner.__dict__["forward"]
    ways = {"all": all_positions_forward(trl_forward, cfg), "liger": liger_head_forward(trl_forward, cfg)}

    def forward(self, *args, **kw):
        way = self.__dict__.get(_HEAD_WAY)
        return trl_forward(*args, **kw) if way is None else ways[way](self, *args, **kw)

    owner.forward = types.MethodType(forward, owner)
    owner.__dict__[_HEAD_WAY] = None
    return owner


@contextlib.contextmanager
def sync_free_head(owner, liger: bool = False):
    """While inside, `owner` (install_head_switch's) runs all_positions_forward (liger: liger_head_forward)."""
    owner.__dict__[_HEAD_WAY] = "liger" if liger else "all"
    try:
        yield
    finally:
        owner.__dict__[_HEAD_WAY] = None


class DeferredStepMetrics:
    """Mixed into the SFT Trainer (before SFTTrainer): the metrics TRL and transformers log, read at log steps."""

    def __init__(self, *args, **kw):
        super().__init__(*args, **kw)  # SFTTrainer's: TRL patches its fused forward onto the model here
        self._head_switch = install_head_switch(self.model)

    def _deferred(self) -> bool:
        return self.toolbox_run.cfg.output.step_metrics in ("deferred", "loss")

    def _loss_only(self) -> bool:
        return self.toolbox_run.cfg.output.step_metrics == "loss"

    def _liger_head(self) -> bool:
        """train.lm_head_kernel as the run resolved it (planning/heads.py): Liger's fused cross-entropy."""
        return self.toolbox_run.lm_head_kernel == "liger"

    def _pend(self, **sums) -> None:
        pend = self.__dict__.setdefault("_pending_sums", {})
        for k, v in sums.items():
            pend[k] = v if k not in pend else pend[k] + v

    def flush_step_metrics(self) -> None:
        """Read the deferred sums (one gather, one host sync) into the state and TRL's metrics; on every rank."""
        pend = self.__dict__.pop("_pending_sums", None)
        if not pend:
            return
        import torch

        keys = sorted(pend)
        vec = torch.stack([torch.as_tensor(pend[k], device=self.args.device).to(torch.float64) for k in keys])
        tot = dict(zip(keys, self.accelerator.gather(vec).reshape(-1, len(keys)).sum(0).tolist()))
        if "tokens" in tot:
            self.state.num_input_tokens_seen += int(tot["tokens"])
        if "valid" in tot:  # what TRL's compute_loss appends, as the mean over the steps since the last log
            m, valid = self._metrics["train"], tot["valid"]
            m["entropy"].append(tot["entropy"] / valid if valid else 0.0)
            m["mean_token_accuracy"].append(tot["correct"] / valid if valid else 0.0)
        if "aux_steps" in tot:  # TRL logs the router loss each step (a host sync); here its mean since the last log
            self._metrics["train"]["aux_loss"].append(tot["aux_loss"] / tot["aux_steps"])
        if "batch_tokens" in tot:
            self._total_train_tokens += int(tot["batch_tokens"])
            self._metrics["train"]["num_tokens"] = [self._total_train_tokens]

    def _track_num_input_tokens(self, inputs):
        # transformers.Trainer's count, without its `.item()`
        if not self._deferred() or self.args.include_num_input_tokens_seen != "non_padding":
            return super()._track_num_input_tokens(inputs)
        pad = getattr(self.processing_class, "pad_token_id", None)
        ids = inputs.get(getattr(self.model, "main_input_name", "input_ids"))
        if "attention_mask" in inputs:
            n = inputs["attention_mask"].sum()
        elif ids is not None and pad is not None:
            n = (ids != pad).sum()
        elif ids is not None:
            n = ids.numel()
        else:
            return super()._track_num_input_tokens(inputs)
        self._pend(tokens=n)

    def log(self, logs, start_time=None):
        self.flush_step_metrics()  # every rank logs (transformers gathers the loss here too)
        return super().log(logs, start_time)

    def _save_checkpoint(self, model, trial):
        self.flush_step_metrics()  # the token count in trainer_state.json
        return super()._save_checkpoint(model, trial)

    def floating_point_ops(self, inputs):
        # transformers counts the model's parameters again every step for this (a loop over every tensor)
        n = self.__dict__.get("_flop_params")
        if n is None:
            n = self._flop_params = (self.model.num_parameters(exclude_embeddings=True)
                                     if hasattr(self.model, "num_parameters") else 0)
        ids = inputs.get(getattr(self.model, "main_input_name", "input_ids"))
        return 6 * ids.numel() * n if ids is not None else 0

    def _head_owner(self, liger: bool = False):
        owner = self.__dict__.get("_head_switch")
        if not self.__dict__.get("_head_logged"):
            from toolbox_train.planning.run import log

            self._head_logged = True
            head = "Liger's fused linear cross-entropy" if liger else "TRL's fused LM head"
            log(f"train.lm_head_kernel: {'liger' if liger else 'trl'}; train.lm_head_tokens: all: " + (
                f"{head} over every position, no mask gather" if owner is not None else "TRL 1.15's fused "
                "forward not found on the model, its head runs as it is (a boolean-mask gather, a host sync)"))
        return owner

    def deferrable_loss(self, model, inputs, return_outputs) -> bool:
        """The one loss computed here: TRL's NLL on its fused head, in training; everything else is TRL's."""
        pc = getattr(self.accelerator, "parallelism_config", None)
        return (self._deferred() and not return_outputs and model.training and self.compute_loss_func is None
                and getattr(self, "label_smoother", None) is None and self.args.loss_type == "nll"
                and not (pc is not None and getattr(pc, "sp_enabled", False))
                and ("attention_mask" in inputs or "position_ids" in inputs))

    def fused_nll_deferred(self, model, inputs, num_items_in_batch):
        """TRL 1.15's SFTTrainer.compute_loss for loss_type nll on its fused LM head (the same forward,
        the same loss and scaling), with its metrics left on the device for flush_step_metrics; with
        `step_metrics: loss` the head computes no entropy or accuracy (loss_only_head)."""
        import torch

        inputs["use_cache"] = False
        if self.aux_loss_enabled:
            inputs["output_router_logits"] = True  # as TRL's compute_loss (VLM wrappers take it only as an argument)
        loss_only = self._loss_only()
        all_tokens = self.toolbox_run.cfg.train.lm_head_tokens == "all"
        liger = loss_only and self._liger_head()
        owner = self._head_owner(liger) if all_tokens or liger else None
        with (loss_only_head() if loss_only else contextlib.nullcontext(),
              sync_free_head(owner, liger) if owner is not None else contextlib.nullcontext()):
            if liger:  # the loss comes back summed and divided by the same count as below
                out = model(**inputs, fused_lm_head=True, num_items_in_batch=num_items_in_batch)
            else:
                out = model(**inputs, fused_lm_head=True)
        n = out.label_mask.sum() if num_items_in_batch is None else num_items_in_batch
        if out.log_probs is None:  # liger_head_forward's
            loss = out.loss
        else:
            loss = (-out.log_probs).sum() / torch.as_tensor(n).clamp(min=1)
        if self.args.average_tokens_across_devices and num_items_in_batch is not None:
            loss = loss * (self.accelerator.num_processes // self.get_tp_size())
        if self.aux_loss_enabled and out.aux_loss is not None:
            # TRL's: a per-micro-batch mean that DDP averages; with num_items_in_batch, averaged over accumulation
            steps = self.current_gradient_accumulation_steps if num_items_in_batch is not None else 1
            loss = loss + self.router_aux_loss_coef * out.aux_loss / steps
            self._pend(aux_loss=out.aux_loss.detach().float(), aux_steps=1)
        batch_tokens = (inputs["attention_mask"].sum() if "attention_mask" in inputs
                        else inputs["position_ids"].size(1))
        if loss_only:
            self._pend(batch_tokens=batch_tokens)
        else:
            self._pend(valid=out.label_mask.sum(), entropy=out.entropy.detach().sum(), correct=out.is_top1.sum(),
                       batch_tokens=batch_tokens)
        return loss
