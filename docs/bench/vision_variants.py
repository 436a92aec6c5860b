"""The finetune variants of vision_rows.py (issue 44): what a row changes in finetune to find where a step's time goes,
as `finetune:BACKEND:METHOD:KEY=VALUE,...` train keys that are not finetune's own:

- `fused_images=1`: the SFT loss on TRL's fused LM head for image batches too;
- `nonblocking=1`: accelerate's batch copy non-blocking (finetune's default since 4fa1444 where memory is pinned);
- `liger_tower=false`: Liger's kernels on the language model only;
- `compile_tower=1|cudagraphs`: the frozen vision tower under torch.compile when training begins.
"""

from __future__ import annotations

import sys


def apply_variants(train: dict) -> list:
    """Pop the variant keys from a row's `train` section, patch what they change; the Trainer callbacks they need."""
    if train.pop("fused_images", False):
        fused_image_batches()
    if train.pop("nonblocking", False):
        nonblocking_batches()
    if train.pop("liger_tower", True) is False:
        liger_off_the_tower()
    compiled = train.pop("compile_tower", None)
    return [tower_compiler(compiled)] if compiled else []


def fused_image_batches() -> None:
    """The `fused_images=1` variant: finetune's SFT loss on TRL's fused LM head for image batches too (they take
    the model's own loss, which builds every position's fp32 logits); what a change in objectives/sft would do."""
    from transformers import Trainer as HFTrainer

    from toolbox_train.objectives.sft import trainer as sft
    from toolbox_train.training import trainer as core

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        if core.fused_head_ok(inputs):
            if self.deferrable_loss(model, inputs, return_outputs):
                return self.fused_nll_deferred(model, inputs, num_items_in_batch)
            return super(sft.ToolboxSFTTrainer, self).compute_loss(model, inputs, return_outputs, num_items_in_batch)
        return HFTrainer.compute_loss(self, model, inputs, return_outputs, num_items_in_batch)

    sft.ToolboxSFTTrainer.compute_loss = compute_loss


def nonblocking_batches() -> None:
    """The `nonblocking=1` variant: accelerate moves each batch to the GPU asynchronously from pinned memory (its
    default copy blocks, a host-device sync at every step's start that the bare loop's non_blocking copy is not)."""
    from toolbox_train.objectives.sft import config as sft_config
    from toolbox_train.training import arguments

    common = arguments.common_args
    patched = lambda p, dist: {**common(p, dist), "accelerator_config": {"non_blocking": True}}  # noqa: E731
    arguments.common_args = sft_config.common_args = patched  # SFT's config imports it by name


def liger_off_the_tower() -> None:
    """The `liger_tower=false` variant: Liger's kernels on the language model only; SigLIP's LayerNorms stay
    torch's (liger_kernel_config layer_norm false, which transformers passes to apply_liger_kernel_to_gemma3). The H100
    profile put Liger's LayerNorm at ~0.28 ms of host time a call (Python stacks recorded, which inflates it), 55
    calls a step on Gemma 3's tower, against 36 us of GPU time (docs/bench/2026-12-07-h100-vision3/)."""
    from toolbox_train.objectives.sft import config as sft_config

    common = sft_config.common_args
    sft_config.common_args = lambda p, dist: {**common(p, dist), "liger_kernel_config": {"layer_norm": False}}


def tower_compiler(mode):
    """The `compile_tower=1|cudagraphs` variant: the frozen vision tower compiled with torch.compile (inductor;
    `cudagraphs`: mode reduce-overhead, its kernels replayed as one CUDA graph) when training begins. A tower
    whose forward is launched op by op costs host time per step that the GPU may wait for (issue 44)."""
    from transformers import TrainerCallback

    class Compile(TrainerCallback):
        def on_train_begin(self, args, state, control, model=None, **kw):
            towers = [m for n, m in model.named_modules() if n.split(".")[-1] in ("vision_tower", "visual")]
            for m in towers[:1]:
                m.compile(mode="reduce-overhead" if mode == "cudagraphs" else None, dynamic=False)
            print(f"compile_tower: {type(towers[0]).__name__ if towers else 'no tower found'} ({mode})",
                  file=sys.stderr)

    return Compile()
