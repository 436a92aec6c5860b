"""TRL 1.15's preference trainers score tokens with a fused LM head whose kernel is Triton
(`trl.trainer.utils._ChunkedLogProbFunction`, GPU only): with the CPU torch wheel it is None
('NoneType' object has no attribute 'apply'), with Triton but no GPU it fails on "0 active
drivers". TRL 1.16 falls back to torch itself, but Unsloth 2026.10.9 (the newest) declares
trl<=1.15.0, so every stack pins 1.15 and this stand-in takes the tensors that are not on a GPU.

Same outputs as the kernel (per-token log-probabilities, and on request the entropy,
log(sum p^2), the mean logit and whether the target is the argmax), from the full logits of
the tokens given: fine for CPU runs, which are small; GPU tensors still go to TRL's kernel.
"""

from __future__ import annotations


class TorchLogProb:
    kernel = None  # TRL's own (None without Triton)

    @staticmethod
    def apply(hidden, weight, bias, targets, temperature, chunk_size, softcap=None, logit_scale=1.0,
              outputs=("entropy", "log_sum_sq_probs", "mean_logits", "is_top1")):
        import torch

        if TorchLogProb.kernel is not None and hidden.is_cuda:
            return TorchLogProb.kernel.apply(hidden, weight, bias, targets, temperature, chunk_size, softcap,
                                             logit_scale, outputs)
        z = hidden.float() @ weight.float().t()
        if bias is not None:
            z = z + bias.float()
        z = z * logit_scale
        if softcap is not None:
            z = softcap * torch.tanh(z / softcap)
        z = z / temperature
        logp = torch.log_softmax(z, dim=-1)
        token = logp.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
        entropy = -(logp.exp() * logp).sum(-1) if "entropy" in outputs else None
        with torch.no_grad():  # the kernel marks these three non-differentiable
            sq = torch.logsumexp(2 * logp, -1) if "log_sum_sq_probs" in outputs else None
            mean = z.mean(-1) if "mean_logits" in outputs else None
            top1 = (z.argmax(-1) == targets) if "is_top1" in outputs else None
        return token, entropy, sq, mean, top1  # fp32, as the kernel


def install() -> None:
    """Route TRL's fused-head call through TorchLogProb (GPU tensors still reach the kernel)."""
    from trl.trainer import utils

    if utils._ChunkedLogProbFunction is not TorchLogProb:
        TorchLogProb.kernel = utils._ChunkedLogProbFunction
        utils._ChunkedLogProbFunction = TorchLogProb
