"""GRPO's hooks (units/objective.py): the sampler picked once (the generation unit), its KV cache in the
memory plan, and before the model loads: the sampler can run here, the groups fill the batch, the
reward functions resolved and tried once (planning/rewards.py), the tools and the environment class
found and checked with the chat template (planning/tools.py), given to the trainer."""

from __future__ import annotations

from toolbox_train.contract import UserError
from toolbox_train.generation import sampler

GENERATION, REWARDS, SECTION = "grpo.generation", "grpo.rewards", "grpo"


def resolve(ctx) -> dict:
    return sampler.resolve(ctx.cfg.grpo, GENERATION, ctx)


def memory(ctx, extras: dict, st, shape) -> tuple:
    g = ctx.cfg.grpo
    return sampler.memory(ctx.cfg, extras, st, shape, ctx.world_size, g.max_completion_length,
                          g.steps_per_generation)


def _environments(env):
    """The trial call's `environments=` (TRL passes each rollout's instance): one made and reset per row."""
    from toolbox_train.contract import first_line

    def made(rows) -> dict:
        out = []
        for row in rows:
            try:
                e = env()
                e.reset(**row)
            except Exception as exc:
                raise UserError(f"{SECTION}.environment: {env.__name__}: making one and calling reset(**row) on a row "
                                f"of the data raised {type(exc).__name__}: {first_line(exc, 200)}") from None
            out.append(e)
        return {"environments": out}

    return made


def prepare(p, tok, sets) -> tuple[list, list[float], list, type | None]:
    """(reward functions, weights, tools, environment class) for the trainer; UserError naming the field
    where the run cannot be."""
    from toolbox_train.planning import rewards, tools

    g = p.cfg.grpo
    try:
        sampler.prepare(g, GENERATION, p.backend, p.gpu)
        sampler.check_groups(g, SECTION, p.batch, p.grad_accum, p.world_size)
        fns, env = tools.load(g.tools, g.environment, p.base, SECTION)
        if fns or env:
            tools.check_template(tok, sets, p.model_path, SECTION)
        if not g.rewards and env is not None and hasattr(env, "get_reward"):
            return [], [], fns, env  # the environment's get_reward is the reward (TRL adds it, weight 1)
        return (*rewards.load(g.rewards, p.base, REWARDS, tok, sets, _environments(env) if env else None), fns, env)
    except UserError as exc:
        raise UserError(p.locate(str(exc))) from None
