"""The preference objectives on TRL's trainers: DPO, KTO and GRPO (trl), ORPO (trl.experimental.orpo,
TRL 1.15). The config section of each (config.py) maps onto the trainer's config; the shared arguments,
checkpoints, resume and LocalSGD are SFT's (sft_config.common_args, trainer.Toolbox).

`check` runs with the other checks, before the model loads; `build` imports TRL (after Unsloth,
when used, so that its patched trainers are the ones taken).
"""

from __future__ import annotations

import dataclasses
import importlib

from ...cli import UserError
from .config import REFERENCE_TEXT, reference

TRAINERS = {"dpo": ("trl", "DPOTrainer", "DPOConfig"), "kto": ("trl", "KTOTrainer", "KTOConfig"),
            "grpo": ("trl", "GRPOTrainer", "GRPOConfig"),
            "orpo": ("trl.experimental.orpo", "ORPOTrainer", "ORPOConfig")}


def section(cfg) -> dict:
    """The config section of the objective in use (config.resolved.yaml shows it alone)."""
    return getattr(cfg, cfg.objective).model_dump(mode="json")


def describe(cfg) -> str:
    """The banner line: the objective, its parameters and the reference model."""
    s = section(cfg)
    if cfg.objective == "grpo":
        s["rewards"] = "+".join(r["function"] if r["weight"] == 1 else f"{r['weight']}*{r['function']}"
                                for r in s["rewards"])
    parts = ", ".join(f"{k} {'+'.join(v) if isinstance(v, list) else v}" for k, v in s.items() if v is not None)
    return f"objective {cfg.objective} ({parts}); {REFERENCE_TEXT[reference(cfg)]}"


def check(p, world_size: int) -> tuple[list, list[float]] | None:
    """Before the model loads: GRPO's reward functions resolve and its groups fill the batch."""
    cfg = p.cfg
    if cfg.objective != "grpo":
        return None
    from . import generation, rewards

    why = generation.refusal(cfg, p.backend, p.gpu)
    if why:
        raise UserError(p.locate(why))
    g = cfg.grpo.num_generations
    batch = cfg.train.per_device_batch_size * p.grad_accum * world_size
    if batch % g:
        raise UserError(p.locate(f"grpo.num_generations: {g} completions per prompt must divide the global "
                                 f"batch of completions ({batch}: per_device_batch_size x accumulation x ranks)"))
    try:
        return rewards.resolve(cfg, p.base)
    except UserError as exc:
        raise UserError(p.locate(str(exc))) from None


def trl_args(p, dist, reward_weights: list[float] | None = None):
    """The TRL config of the objective: the shared arguments plus the objective's section."""
    from ..sft_config import common_args
    from . import generation

    cfg = p.cfg
    mod, _, config_name = TRAINERS[cfg.objective]
    cls = getattr(importlib.import_module(mod), config_name)
    kw = common_args(p, dist)
    kw["max_length"] = cfg.data.max_seq_length
    if cfg.objective == "dpo":
        d = cfg.dpo
        kw.update(beta=d.beta, loss_type=d.loss_type if isinstance(d.loss_type, list) else [d.loss_type],
                  loss_weights=d.loss_weights, label_smoothing=d.label_smoothing)
    elif cfg.objective == "orpo":
        kw.update(beta=cfg.orpo.beta)
    elif cfg.objective == "kto":
        k = cfg.kto
        kw.update(beta=k.beta, desirable_weight=k.desirable_weight, undesirable_weight=k.undesirable_weight)
    else:
        g = cfg.grpo
        kw.update(num_generations=g.num_generations, max_completion_length=g.max_completion_length,
                  temperature=g.temperature, beta=g.beta, reward_weights=reward_weights,
                  shuffle_dataset=cfg.data.shuffle, **generation.trl_kwargs(g))
    fields = {f.name for f in dataclasses.fields(cls)}
    return cls(**{k: v for k, v in kw.items() if k in fields})


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


def build(p, dist, model, tok, peft_cfg, train_ds, eval_ds, callbacks, rewards=None):
    """The objective's TRL trainer with the Toolbox additions, ready to train."""
    from . import logprob
    from ..trainer import Toolbox

    if not p.gpu:
        logprob.install()  # TRL 1.15's fused LM head is a Triton kernel (logprob.py)
    mod, trainer_name, _ = TRAINERS[p.cfg.objective]
    base = getattr(importlib.import_module(mod), trainer_name)
    cls = type(f"Toolbox{base.__name__}", (PairedTokens, Toolbox, base), {})
    funcs, weights = rewards or (None, None)
    args = trl_args(p, dist, weights)
    kw = dict(model=model, args=args, train_dataset=train_ds, eval_dataset=eval_ds, processing_class=tok,
              peft_config=peft_cfg, plan=p, callbacks=callbacks)
    if p.cfg.objective == "grpo":
        kw["reward_funcs"] = funcs
    if p.cfg.objective == "orpo" and "prompt" not in train_ds.column_names:
        # DPOTrainer and KTOTrainer take an implicit prompt out themselves; ORPOTrainer does not
        from trl.data_utils import extract_prompt

        train_ds = kw["train_dataset"] = train_ds.map(extract_prompt)
        if eval_ds is not None:
            kw["eval_dataset"] = eval_ds.map(extract_prompt)
    return cls(**kw)
