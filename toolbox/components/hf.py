"""The Hugging Face stack at exact versions: transformers, trl, peft, accelerate, datasets."""

from pydantic import Field, field_validator

from toolbox.components import Component, LockPart, Model
from toolbox.components.values import check_version as _version

NAMES = ("accelerate", "datasets", "peft", "transformers", "trl")


def requirements(stack) -> list[str]:
    return [f"{n}=={getattr(stack.model.hf, n)}" for n in NAMES]


def _pins(stack):
    return {f"{n}.version": getattr(stack.model.hf, n) for n in NAMES}


class Hf(Model):
    transformers: str = Field(description='exact transformers version')
    trl: str = Field(description='exact trl version')
    peft: str = Field(description='exact peft version')
    accelerate: str = Field(description='exact accelerate version')
    datasets: str = Field(description='exact datasets version')
    _v = field_validator("transformers", "trl", "peft", "accelerate", "datasets")(
        classmethod(lambda cls, v: _version(v))
    )


COMPONENT = Component("hf", place=50,
                      block=Hf, field=Field(description='the Hugging Face training libraries'),
                      applies=lambda s: True, pins=_pins, runtime="runtime/hf.j2",
                      lock=lambda s: LockPart(requirements=tuple(requirements(s))),
                      exports=lambda s: {"reqs": requirements(s)},  # what later steps repeat to keep it
                      variables=lambda s, pin_set: {"hf_reqs": requirements(s)})
