"""On-policy distillation on TRL's DistillationTrainer, with the Toolbox additions and the static
sampler's compiled decoding (generation/trainer.py). TRL 1.15 computes the loss with a Triton kernel
(`_chunked_divergence_loss`, GPU only); tensors that are not on a GPU go through `TorchDivergence`,
the same generalized JSD on materialized logits (fine for CPU runs, which are small)."""

from __future__ import annotations

from toolbox_train.generation.trainer import mixins as sampler_mixins
from toolbox_train.objectives.distill.config import distill_args
from toolbox_train.training import preference


def _logits(hidden, weight, bias, scale: float, softcap):
    import torch

    z = hidden.float() @ weight.float().t()
    if bias is not None:
        z = z + bias.float()
    z = z * scale
    return softcap * torch.tanh(z / softcap) if softcap is not None else z


def torch_divergence(student_hidden_states, teacher_hidden_states, student_lm_head_weight, teacher_lm_head_weight,
                     completion_mask, beta, num_items_in_batch=None, student_lm_head_bias=None,
                     teacher_lm_head_bias=None, student_logit_scale=1.0, teacher_logit_scale=1.0,
                     student_final_logit_softcapping=None, teacher_final_logit_softcapping=None, temperature=1.0):
    """TRL's `_chunked_divergence_loss` (same arguments, same (loss, entropy sum, valid tokens)) in torch:
    the masked positions' logits through each model's head, TRL's generalized JSD per token (its GKD
    trainer's `generalized_jsd_loss`, summed over the vocabulary), reduced as the kernel's caller does."""
    import torch
    from trl.experimental.gkd import GKDTrainer

    valid = completion_mask.reshape(-1) != 0
    s = _logits(student_hidden_states.reshape(-1, student_hidden_states.size(-1))[valid], student_lm_head_weight,
                student_lm_head_bias, student_logit_scale, student_final_logit_softcapping)
    t = _logits(teacher_hidden_states.reshape(-1, teacher_hidden_states.size(-1))[valid], teacher_lm_head_weight,
                teacher_lm_head_bias, teacher_logit_scale, teacher_final_logit_softcapping)
    per_token = GKDTrainer.generalized_jsd_loss(s, t, beta=beta, temperature=temperature, reduction="none").sum(-1)
    logp = torch.log_softmax(s / temperature, dim=-1)
    entropy = -(logp.exp() * logp).sum(-1).detach()
    n = valid.sum()
    loss = per_token.sum()
    loss = loss / (n.clamp(min=1) if num_items_in_batch is None else num_items_in_batch)
    return loss, entropy.sum(), n


class TorchDivergence:
    """The loss of tensors that are not on a GPU through `torch_divergence`; GPU tensors to TRL's kernel."""

    def _compute_loss(self, unwrapped_student, inputs, num_items_in_batch):
        from trl.trainer import distillation_trainer as dt

        if inputs["completion_ids"].is_cuda:
            return super()._compute_loss(unwrapped_student, inputs, num_items_in_batch)
        kernel = dt._chunked_divergence_loss
        dt._chunked_divergence_loss = torch_divergence
        try:
            return super()._compute_loss(unwrapped_student, inputs, num_items_in_batch)
        finally:
            dt._chunked_divergence_loss = kernel


def build(p, dist, model, tok, peft_cfg, train_ds, eval_ds, callbacks):
    """The teacher as its folder (p.extras, resolved and checked before loading): TRL loads it."""
    from trl import DistillationTrainer

    tok.padding_side = "left"  # TRL's generation batch is left-padded
    return preference.trainer(p, DistillationTrainer, distill_args(p, dist), model, tok, peft_cfg, train_ds, eval_ds,
                              callbacks, mixins=(TorchDivergence, *sampler_mixins(p.extras)), teacher_model=p.extras["teacher"])
