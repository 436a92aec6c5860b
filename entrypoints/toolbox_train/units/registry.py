"""The objective registry: the units found in objectives/ (each subpackage's `UNIT`), the one list of
objectives. The schema (`objective:` and the sections), the checks, the memory planner, model loading
and `build` read it; no module lists objectives (tests/train/test_objective_registry.py).

Found, not listed: each folder of objectives/ with an `__init__.py` is imported by name here, the one
place an objective is imported from below it (docs/architecture.md, Layers). Importing a unit imports
no TRL: `build` imports its trainer module when a run builds its trainer, after Unsloth when it is
used, so that its patched trainers are the ones taken.
"""

from __future__ import annotations

import importlib
import importlib.util
import pkgutil

from toolbox_train.units.objective import Objective

PACKAGE = "toolbox_train.objectives"


def found(package: str = PACKAGE) -> dict[str, Objective]:
    """{name: unit} of each subpackage of `package`, the default first, then by name."""
    spec = importlib.util.find_spec(package)
    names = sorted(m.name for m in pkgutil.iter_modules(spec.submodule_search_locations) if m.ispkg)
    units = [importlib.import_module(f"{package}.{n}").UNIT for n in names]
    for n, u in zip(names, units):
        if u.name != n:
            raise ImportError(f"{package}.{n}: its UNIT is named {u.name!r}, not its folder's name")
    defaults = [u for u in units if u.default]
    if len(defaults) != 1:
        raise ImportError(f"{package}: {len(defaults)} units say default=True; one must")
    return {u.name: u for u in sorted(units, key=lambda u: not u.default)}  # the default first, then by name


REGISTRY: dict[str, Objective] = found()
DEFAULT = next(iter(REGISTRY))


def of(cfg) -> Objective:
    """The unit of the config's objective."""
    return REGISTRY[getattr(cfg, "objective", DEFAULT)]


def named(having) -> str:
    """The names of the units `having(unit)` holds for, as messages write them ('dpo/orpo/reward')."""
    return "/".join(n for n, u in REGISTRY.items() if having(u))


def data_formats() -> dict[str, str]:
    """{objective: the TRL dataset type it trains on}, for the objectives that name one."""
    return {n: u.data_format for n, u in REGISTRY.items() if u.data_format}


def build(p, dist, model, tok, peft_cfg, train_ds, eval_ds, callbacks):
    """The run's objective's trainer, ready to train (`p.inputs`: what the unit's prepare gave it). The
    trainer module is imported by name, when a run builds it (after Unsloth, where it is used)."""
    module = importlib.import_module(f"{PACKAGE}.{p.objective.name}.trainer")
    return module.build(p, dist, model, tok, peft_cfg, train_ds, eval_ds, callbacks)
