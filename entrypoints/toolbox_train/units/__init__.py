"""Objective units: the contract of one (its declaration and hooks) and the registry that finds them.

The registry walks objectives/ (units/registry.py); the run calls each unit's hooks.

  objective   the contract of an objective unit: its declaration and its hooks (resolve, prepare, memory)
  registry    the objectives found in objectives/ (each subpackage's UNIT), one list; `build` by name

An objective unit is one folder, objectives/<name>/, at the top of the training package's layers: it
imports what it needs from below, and nothing below imports it; the layers below read it through
this registry and the run (`ResolvedRun.objective`, `.extras`, `.inputs`).
"""
