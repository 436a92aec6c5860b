"""What the preference objectives (DPO, ORPO, KTO, GRPO, the reward model) share on top of TRL's
trainers: the token count of paired batches, and the trainer class put together with the Toolbox
mixin (their TRL config from the shared arguments: training/arguments.py's trl_config). Each
objective's own part is its unit, objectives/<name>/ (config.py, trainer.py)."""

from __future__ import annotations


class PairedTokens:
    """Tokens seen for a batch of chosen/rejected sequences without `input_ids` (ORPO's): both sides,
    each prompt + completion, as DPO's concatenated batch counts them. transformers counts only
    `input_ids` and would record 0 tokens (and 0 tokens/s) for every ORPO step."""

    def _track_num_input_tokens(self, inputs):
        if "input_ids" not in inputs and "chosen_input_ids" in inputs and "rejected_input_ids" in inputs:
            import torch

            sides = ("chosen", "rejected")
            both = {"input_ids": torch.cat([inputs[f"{s}_input_ids"].flatten() for s in sides])}
            if all(f"{s}_attention_mask" in inputs for s in sides):
                both["attention_mask"] = torch.cat([inputs[f"{s}_attention_mask"].flatten() for s in sides])
            inputs = both
        return super()._track_num_input_tokens(inputs)


def trainer(p, base, args, model, tok, peft_cfg, train_ds, eval_ds, callbacks, mixins=(), **more):
    """TRL's trainer class `base` with the Toolbox additions (and `mixins`), built and ready to train."""
    from toolbox_train.training import logprob
    from toolbox_train.training.trainer import Toolbox

    if not p.gpu:
        logprob.install()  # TRL 1.15's fused LM head is a Triton kernel (logprob.py)
    cls = type(f"Toolbox{base.__name__}", (PairedTokens, Toolbox, *mixins, base), {})
    return cls(model=model, args=args, train_dataset=train_ds, eval_dataset=eval_ds, processing_class=tok,
               peft_config=peft_cfg, run=p, callbacks=callbacks, **more)
