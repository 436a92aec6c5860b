"""The training objectives, one unit each (a folder): SFT, DPO, ORPO, KTO, GRPO and the reward model.

Each unit is `<name>/`: its `__init__.py` declares it (an `Objective`: its train.yaml section, the
rows it trains on, its reference model; no TRL), `config.py` maps the run onto TRL's config of its
trainer and `trainer.py` is TRL's trainer with the Toolbox additions (training/trainer.py). This
module is the registry, the one list of objectives: the schema (`objective:` and the sections),
the checks, the memory planner and model loading read it.

Importing this package imports no TRL: `build` imports the objective's trainer module when a run
builds its trainer, after Unsloth when it is used, so that its patched trainers are the ones taken.
"""

from __future__ import annotations

import importlib

from toolbox_train.objectives import dpo, grpo, kto, orpo, reward, sft
from toolbox_train.objectives.unit import Objective

REGISTRY: dict[str, Objective] = {u.UNIT.name: u.UNIT for u in (sft, dpo, orpo, kto, grpo, reward)}


def of(cfg) -> Objective:
    """The unit of the config's objective."""
    return REGISTRY[getattr(cfg, "objective", "sft")]


def data_formats() -> dict[str, str]:
    """{objective: the TRL dataset type it trains on}, for the objectives that name one."""
    return {n: u.data_format for n, u in REGISTRY.items() if u.data_format}


def build(p, dist, model, tok, peft_cfg, train_ds, eval_ds, callbacks, fmt: str = "text", rewards=None):
    """The objective's trainer, ready to train. `fmt`: the data format (SFT's loss masking follows it);
    `rewards`: GRPO's (functions, weights) from planning.rewards.check. The trainer module is imported by
    name here, not above: the registry stays below the trainers' layer (docs/architecture.md)."""
    module = importlib.import_module(f"{__name__}.{p.objective.name}.trainer")
    return module.build(p, dist, model, tok, peft_cfg, train_ds, eval_ds, callbacks, fmt=fmt, rewards=rewards)
