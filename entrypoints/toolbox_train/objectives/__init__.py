"""The training objectives, one unit each (a folder), found by units/registry.py (docs/preference.md's table).

Each unit is `<name>/`: its `__init__.py` declares it (`UNIT`, a units.objective.Objective: its
train.yaml section, the rows it trains on, its hooks; no TRL at import), `config.py` maps the run onto
TRL's config of its trainer and `trainer.py` is TRL's trainer with the Toolbox additions
(training/trainer.py). The folder is the top of the training package's layers: nothing below names
an objective (tests/train/test_objective_registry.py).
"""
