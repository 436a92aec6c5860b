"""The preference objectives on TRL's trainers: DPO, KTO and GRPO (trl), ORPO (trl.experimental.orpo,
TRL 1.15). The config section of each (config.py) maps onto the trainer's config; the shared arguments,
checkpoints, resume and LocalSGD are SFT's (sft_config.common_args, trainer.Toolbox).

`check` runs with the other checks, before the model loads; `build` imports TRL (after Unsloth,
when used, so that its patched trainers are the ones taken).
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import inspect

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
    parts = ", ".join(f"{k} {'+'.join(map(str, v)) if isinstance(v, list) else v}" for k, v in s.items()
                      if v is not None)  # loss_type [sigmoid, sft] -> sigmoid+sft, loss_weights -> 1.0+0.5
    return f"objective {cfg.objective} ({parts}); {REFERENCE_TEXT[reference(cfg)]}"


def check(p, world_size: int, tok=None, sets=()) -> tuple[list, list[float]] | None:
    """Before the model loads: GRPO's reward functions resolve and its groups fill the batch; with
    `tok` and `sets` ((dataset, field), ...) each function is called on a few rows of each (rewards.trial)."""
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
        funcs, weights = rewards.resolve(cfg, p.base)
        for ds, field in sets:
            rewards.trial(cfg, funcs, ds, tok, field)
        return funcs, weights
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


class RewardRaised(Exception):
    """A reward function raised during training: its index in grpo.rewards, and the exception."""

    def __init__(self, index: int, exc: Exception):
        super().__init__(index, exc)
        self.index, self.exc = index, exc


def guarded(index: int, fn):
    """`fn`, whose exceptions come out as RewardRaised naming its entry (TRL's own would not name it).
    Async functions are left as they are: TRL tells them apart by their type."""
    if inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(getattr(fn, "__call__", None)):
        return fn

    @functools.wraps(fn)
    def call(*args, **kw):
        try:
            return fn(*args, **kw)
        except Exception as exc:
            raise RewardRaised(index, exc) from exc

    return call


class FiniteRewards:
    """GRPO: a reward that is NaN/inf, or None (which TRL 1.15 turns into NaN and leaves out of the mean,
    so that a run whose reward function always fails trains on zero advantages and exits 0), stops the run
    as a NaN loss does, naming the function; so does a function that raises (guarded). The NaN check is on
    the rewards gathered from every rank, so every rank stops at the same step."""

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        import torch

        from ...cli import first_line

        step = self.state.global_step + 1
        try:
            rewards = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        except RewardRaised as e:
            fn = self.toolbox_plan.cfg.grpo.rewards[e.index].function
            raise self.stopped(f"grpo.rewards.{e.index}.function {fn} raised {type(e.exc).__name__}: "
                               f"{first_line(e.exc, 200)} at step {step}", "fix the function, then resume") from None
        bad = ~torch.isfinite(rewards)
        if bad.any():
            entries = self.toolbox_plan.cfg.grpo.rewards
            named = "; ".join(f"grpo.rewards.{i}.function {entries[i].function}: {int(bad[:, i].sum())} of "
                              f"{len(bad)} completions" for i in bad.any(0).nonzero().flatten().tolist())
            raise self.stopped(f"a reward function returned NaN/inf or None at step {step} "
                               f"({named})", "every completion needs a finite number from every reward function")
        return rewards


def build(p, dist, model, tok, peft_cfg, train_ds, eval_ds, callbacks, rewards=None):
    """The objective's TRL trainer with the Toolbox additions, ready to train."""
    from . import logprob
    from ..trainer import Toolbox

    if not p.gpu:
        logprob.install()  # TRL 1.15's fused LM head is a Triton kernel (logprob.py)
    mod, trainer_name, _ = TRAINERS[p.cfg.objective]
    base = getattr(importlib.import_module(mod), trainer_name)
    mixins = (PairedTokens, Toolbox) + ((FiniteRewards,) if p.cfg.objective == "grpo" else ())
    cls = type(f"Toolbox{base.__name__}", (*mixins, base), {})
    funcs, weights = rewards or (None, None)
    args = trl_args(p, dist, weights)
    kw = dict(model=model, args=args, train_dataset=train_ds, eval_dataset=eval_ds, processing_class=tok,
              peft_config=peft_cfg, plan=p, callbacks=callbacks)
    if p.cfg.objective == "grpo":
        kw["reward_funcs"] = [guarded(i, f) for i, f in enumerate(funcs)]
    if p.cfg.objective == "orpo" and "prompt" not in train_ds.column_names:
        # DPOTrainer and KTOTrainer take an implicit prompt out themselves; ORPOTrainer does not
        from trl.data_utils import extract_prompt

        train_ds = kw["train_dataset"] = train_ds.map(extract_prompt)
        if eval_ds is not None:
            kw["eval_dataset"] = eval_ds.map(extract_prompt)
    return cls(**kw)
