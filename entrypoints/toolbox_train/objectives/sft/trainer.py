"""SFT on TRL's SFTTrainer, with the Toolbox additions (training/trainer.py) and its per-step
metrics read at log steps (training/step_metrics.py)."""

from __future__ import annotations

from trl import SFTTrainer

from toolbox_train.objectives.sft import config as sft_config
from toolbox_train.training import trainer as core
from toolbox_train.training.step_metrics import DeferredStepMetrics
from toolbox_train.training import vision
from toolbox_train.training.vision import VisionCollator
from toolbox_train.data.images import FORMAT as VISION_FORMAT


class ToolboxSFTTrainer(core.Toolbox, DeferredStepMetrics, SFTTrainer):
    """SFTTrainer with the Toolbox additions; its loss through the sync-free fused head where it can."""

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        if core.fused_head_ok(inputs) and "pixel_values" not in inputs:  # image batches: the model's own loss  # through the module: bench's TRL rows replace it
            if self.deferrable_loss(model, inputs, return_outputs):
                return self.fused_nll_deferred(model, inputs, num_items_in_batch)
            return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
        # TRL's fused LM-head loss is a Triton kernel (GPU only): on CPU use the model's own loss.
        from transformers import Trainer as HFTrainer

        return HFTrainer.compute_loss(self, model, inputs, return_outputs, num_items_in_batch)

    def _load_from_checkpoint(self, resume_from_checkpoint, model=None):
        if vision.converted_resume(model or self.model):  # a whole VLM: its checkpoint's names are not its own
            return vision.load_converted(model or self.model, resume_from_checkpoint)
        return super()._load_from_checkpoint(resume_from_checkpoint, model)


def build(p, dist, model, tok, peft_cfg, train_ds, eval_ds, callbacks):
    """SFT's trainer, ready to train (the run's data format, which the loss masking follows)."""
    fmt = p.data_format or "text"
    args = sft_config.sft_args(p, dist, fmt)  # through the module: bench's calibration wraps it
    collator = None
    if fmt == VISION_FORMAT:  # image rows: our labels (training/vision.py), the processor in the tokenizer's place
        collator = VisionCollator(tok, p.seq_tokens, p.cfg.data.train_on, vision.PAD_MULTIPLE if p.gpu else 1)
    return ToolboxSFTTrainer(model=model, args=args, train_dataset=train_ds, eval_dataset=eval_ds,
                             processing_class=tok, peft_config=peft_cfg, run=p, callbacks=callbacks,
                             data_collator=collator)
