"""The SFT trainer's per-step metrics without a host sync per step (issue 26).

TRL's SFTTrainer reads its entropy, token accuracy and token count back to the host after every
forward (`.item()`), and transformers its token count after every backward: each read stops the
host until the device has caught up, so the kernels that follow start from an empty queue (on a
small model, whose steps are short, the GPU then waits for the host). With `output.step_metrics:
deferred` (the default) the same sums stay on the device and are read once per log step, where
transformers reads the loss anyway; `synced` runs TRL's and transformers' own code.
"""

from __future__ import annotations


class DeferredStepMetrics:
    """Mixed into the SFT Trainer (before SFTTrainer): the metrics TRL and transformers log, read at log steps."""

    def _deferred(self) -> bool:
        return self.toolbox_plan.cfg.output.step_metrics == "deferred"

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
            self._total_train_tokens += int(tot["batch_tokens"])
            m["num_tokens"] = [self._total_train_tokens]

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

    def deferrable_loss(self, model, inputs, return_outputs) -> bool:
        """The one loss computed here: TRL's NLL on its fused head, in training; everything else is TRL's."""
        pc = getattr(self.accelerator, "parallelism_config", None)
        return (self._deferred() and not return_outputs and model.training and self.compute_loss_func is None
                and getattr(self, "label_smoother", None) is None and self.args.loss_type == "nll"
                and not self.aux_loss_enabled and not (pc is not None and getattr(pc, "sp_enabled", False))
                and ("attention_mask" in inputs or "position_ids" in inputs))

    def fused_nll_deferred(self, model, inputs, num_items_in_batch):
        """TRL 1.15's SFTTrainer.compute_loss for loss_type nll on its fused LM head (the same forward,
        the same loss and scaling), with its metrics left on the device for flush_step_metrics."""
        import torch

        inputs["use_cache"] = False
        out = model(**inputs, fused_lm_head=True)
        n = out.label_mask.sum() if num_items_in_batch is None else num_items_in_batch
        loss = (-out.log_probs).sum() / torch.as_tensor(n).clamp(min=1)
        if self.args.average_tokens_across_devices and num_items_in_batch is not None:
            loss = loss * (self.accelerator.num_processes // self.get_tp_size())
        batch_tokens = (inputs["attention_mask"].sum() if "attention_mask" in inputs
                        else inputs["position_ids"].size(1))
        self._pend(valid=out.label_mask.sum(), entropy=out.entropy.detach().sum(), correct=out.is_top1.sum(),
                   batch_tokens=batch_tokens)
        return loss
