"""GRPO on TRL's GRPOTrainer, with the Toolbox additions: each reward function guarded so that one
that raises is named, a NaN/inf/None reward stopping the run as a NaN loss does (training/rewards.py),
and the static-cache sampler's decoding compiled (generation/trainer.py). The functions themselves are
resolved and tried once before the model loads (its prepare hook: `p.inputs`); the sampler was picked
when the run was resolved (`p.extras`). With tools or an environment (TRL's `tools`, `environment_factory`), each step
also logs the tool calls made and failed and the turns per completion (ToolTurns)."""

from __future__ import annotations

from toolbox_train.generation.trainer import mixins as sampler_mixins
from toolbox_train.objectives.grpo.config import grpo_args
from toolbox_train.training import preference
from toolbox_train.training.rewards import FiniteRewards, for_trl


class ToolTurns:
    """With tools: per step, the tool calls made (`tools/calls`) and failed (`tools/failures`: a tool that
    raised, an unknown name), and the assistant turns per completion (`tools/turns`, mean; `tools/max_turns`),
    over every rank's completions; TRL 1.15 logs only the calls per completion (`tools/call_frequency`) and
    the failed share (`tools/failure_frequency`)."""

    def _tool_call_loop(self, *args, **kw):
        import torch

        out = super()._tool_call_loop(*args, **kw)
        completions, calls, failures = out[1], out[4], out[5]
        turns = [sum(1 for m in c if m.get("role") == "assistant") for c in completions]
        mine = torch.tensor([calls, failures, sum(turns), len(turns), max(turns, default=0)], dtype=torch.float64,
                            device=self.accelerator.device)
        t = self.accelerator.gather(mine).reshape(-1, 5)
        m = self._metrics["train" if self.model.training else "eval"]
        m["tools/calls"].append(t[:, 0].sum().item())
        m["tools/failures"].append(t[:, 1].sum().item())
        m["tools/turns"].append((t[:, 2].sum() / t[:, 3].sum().clamp(min=1)).item())
        m["tools/max_turns"].append(t[:, 4].max().item())
        return out


def build(p, dist, model, tok, peft_cfg, train_ds, eval_ds, callbacks):
    """`p.inputs`: (functions, weights, tools, environment class) as the unit's prepare hook resolved them."""
    from trl import GRPOTrainer

    funcs, weights, tools, env = p.inputs or (None, None, None, None)
    agent = {"tools": tools or None, "environment_factory": env} if tools or env else {}
    return preference.trainer(p, GRPOTrainer, grpo_args(p, dist, weights), model, tok, peft_cfg, train_ds, eval_ds,
                              callbacks, mixins=(FiniteRewards, *sampler_mixins(p.extras), *((ToolTurns,) if agent else ())),
                              reward_funcs=for_trl(funcs), **agent)
