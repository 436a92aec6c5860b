"""GRPO's hooks (units/objective.py): the sampler picked once (the generation unit), its KV cache in the
memory plan, and before the model loads: the sampler can run here, the groups fill the batch, the
reward functions resolved and tried once (planning/rewards.py), given to the trainer."""

from __future__ import annotations

from toolbox_train.contract import UserError
from toolbox_train.generation import sampler

GENERATION, REWARDS = "grpo.generation", "grpo.rewards"


def resolve(ctx) -> dict:
    return sampler.resolve(ctx.cfg.grpo, GENERATION, ctx.backend, ctx.gpu)


def memory(ctx, extras: dict, st, shape) -> tuple:
    g = ctx.cfg.grpo
    return sampler.memory(ctx.cfg, extras, st, shape, ctx.world_size, g.max_completion_length,
                          g.steps_per_generation)


def prepare(p, tok, sets) -> tuple[list, list[float]]:
    """(reward functions, weights) for the trainer; UserError naming the field where the run cannot be."""
    from toolbox_train.planning import rewards

    g = p.cfg.grpo
    try:
        sampler.prepare(g, GENERATION, p.backend, p.gpu)
        spg = g.steps_per_generation
        batch = p.batch * (spg or p.grad_accum) * p.world_size  # TRL's generation batch
        if batch % g.num_generations:
            steps = "grpo.steps_per_generation" if spg else "accumulation"
            raise UserError(f"grpo.num_generations: {g.num_generations} completions per prompt must divide the "
                            f"global batch of completions ({batch}: per_device_batch_size x {steps} x ranks)")
        return rewards.load(g.rewards, p.base, REWARDS, tok, sets)
    except UserError as exc:
        raise UserError(p.locate(str(exc))) from None
