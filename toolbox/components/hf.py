"""The Hugging Face stack at exact versions: transformers, trl, peft, accelerate, datasets."""

from toolbox.components import Component

NAMES = ("accelerate", "datasets", "peft", "transformers", "trl")


def requirements(stack) -> list[str]:
    return [f"{n}=={getattr(stack.hf, n)}" for n in NAMES]


def _pins(stack):
    return {f"{n}.version": getattr(stack.hf, n) for n in NAMES}


COMPONENT = Component("hf", applies=lambda s: True, pins=_pins, runtime="runtime/hf.j2",
                      variables=lambda s, pin_set: {"hf_reqs": requirements(s)})
