"""The project's training entrypoints (finetune, launch, rccl-check), then the final pip check."""

from toolbox.components import Component

COMPONENT = Component("entrypoints", applies=lambda s: True, pins=lambda s: {}, runtime="runtime/entrypoints.j2")
