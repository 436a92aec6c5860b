"""RLOO's hooks (units/objective.py), the shared units' as GRPO calls them: the sampler picked once, its
KV cache in the memory plan, and before the model loads the sampler can run here, the groups fill the
batch, the reward functions resolved and tried once (planning/rewards.py)."""

from __future__ import annotations

from toolbox_train.contract import UserError
from toolbox_train.generation import sampler

SECTION = "rloo"


def resolve(ctx) -> dict:
    return sampler.resolve(ctx.cfg.rloo, f"{SECTION}.generation", ctx)


def memory(ctx, extras: dict, st, shape) -> tuple:
    r = ctx.cfg.rloo
    return sampler.memory(ctx.cfg, extras, st, shape, ctx.world_size, r.max_completion_length,
                          r.steps_per_generation)


def prepare(p, tok, sets) -> tuple[list, list[float]]:
    """(reward functions, weights) for the trainer; UserError naming the field where the run cannot be."""
    from toolbox_train.planning import rewards

    r = p.cfg.rloo
    try:
        sampler.prepare(r, f"{SECTION}.generation", p.backend, p.gpu)
        sampler.check_groups(r, SECTION, p.batch, p.grad_accum, p.world_size)
        return rewards.load(r.rewards, p.base, f"{SECTION}.rewards", tok, sets)
    except UserError as exc:
        raise UserError(p.locate(str(exc))) from None
