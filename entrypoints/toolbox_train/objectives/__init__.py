"""The training objectives, one TRL trainer each: SFT, DPO, ORPO, KTO and GRPO.

As TRL lays out its own, each objective is a `<name>_config.py` (the run's config and what the
checks resolved, mapped onto TRL's config of that trainer) and a `<name>_trainer.py` (TRL's
trainer with the Toolbox additions of training/trainer.py). preference.py holds what the four
preference objectives share, logprob.py the CPU stand-in for TRL's fused LM head. The objective's
train.yaml section is in config/objectives.py; its checks before loading in planning/.

Importing this package imports no TRL: `build` imports the objective's trainer module, after
Unsloth when it is used, so that its patched trainers are the ones taken.
"""

from __future__ import annotations

from toolbox_train.config.objectives import REFERENCE_TEXT, reference

OBJECTIVES = ("sft", "dpo", "orpo", "kto", "grpo")


def section(cfg) -> dict:
    """The config section of the objective in use (config.resolved.yaml shows it alone)."""
    return getattr(cfg, cfg.objective).model_dump(mode="json")


def describe(cfg) -> str:
    """The banner line: the objective, its parameters and the reference model."""
    s = section(cfg)
    if cfg.objective == "grpo":
        s["rewards"] = "+".join(r["function"] if r["weight"] == 1 else f"{r['weight']}*{r['function']}"
                                for r in s["rewards"])
    parts = ", ".join(f"{k} {'+'.join(map(str, v)) if isinstance(v, list) else v}" for k, v in s.items()
                      if v is not None)  # loss_type [sigmoid, sft] -> sigmoid+sft, loss_weights -> 1.0+0.5
    return f"objective {cfg.objective} ({parts}); {REFERENCE_TEXT[reference(cfg)]}"


def build(p, dist, model, tok, peft_cfg, train_ds, eval_ds, callbacks, fmt: str = "text", rewards=None):
    """The objective's trainer, ready to train. `fmt`: the data format (SFT's loss masking follows it);
    `rewards`: GRPO's (functions, weights) from planning.rewards.check."""
    name = p.cfg.objective
    if name == "sft":
        from toolbox_train.objectives import sft_trainer as module
    elif name == "dpo":
        from toolbox_train.objectives import dpo_trainer as module
    elif name == "orpo":
        from toolbox_train.objectives import orpo_trainer as module
    elif name == "kto":
        from toolbox_train.objectives import kto_trainer as module
    elif name == "grpo":
        from toolbox_train.objectives import grpo_trainer as module
    else:
        raise ValueError(f"objective {name!r}: not one of {OBJECTIVES}")
    return module.build(p, dist, model, tok, peft_cfg, train_ds, eval_ds, callbacks, fmt=fmt, rewards=rewards)
