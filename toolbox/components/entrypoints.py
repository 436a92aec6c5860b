"""The project's training entrypoints (finetune, launch, rccl-check), then the final pip check."""

from toolbox.components import Component, ContextFile
from toolbox.paths import PROJECT_ROOT

COMPONENT = Component("entrypoints", place=90, applies=lambda s: True, runtime="runtime/entrypoints.j2",
                      context=lambda s: [ContextFile("entrypoints", src=PROJECT_ROOT / "entrypoints")])
