"""The project's training entrypoints (finetune, launch, rccl-check), then the final pip check."""

from toolbox.components import PROJECT_ROOT, Component, ContextFile

COMPONENT = Component("entrypoints", applies=lambda s: True, runtime="runtime/entrypoints.j2",
                      context=lambda s: [ContextFile("entrypoints", src=PROJECT_ROOT / "entrypoints")])
