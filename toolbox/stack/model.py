"""The stack schema: pydantic models that forbid unknown keys, one description per field.

Each block (`rocm:`, `torch:`, ...) is its component's own model (toolbox.components.<name>,
`Component.block`); this module composes them with the stack's top fields and runs each active
block's component's `checks` (what it asks of the stack and of the blocks it depends on). Validation only (the checks of single values are toolbox.components.values): reading the
YAML (lines, `extends:`, `--set`) is toolbox.stack.source, and what is derived from a valid stack
(patch files, pins, digest) is toolbox.stack.resolved and toolbox.stack.digest.
`python -c 'import json, toolbox.stack.model as m; print(json.dumps(m.StackModel.model_json_schema()))'`
prints the schema with these descriptions.
"""

from __future__ import annotations

import re
from typing import Literal, Optional

from pydantic import Field, create_model, field_validator, model_validator

from toolbox.components import Model, registry
from toolbox.components.values import FieldError, check_targets


class StackFields(Model):
    """The stack's own fields and the checks across blocks; StackModel adds the components' blocks."""

    name: str = Field(description="stack name: lower case letters, digits, '.', '_' or '-'; part of the image tag")
    description: str = Field("", description='one line saying what the stack is for')
    platform: Literal["rocm", "cuda", "cpu"] = Field(description='rocm, cuda or cpu: which blocks below apply')
    gpu_targets: list[str] = Field(default_factory=list, description='AMD GPU targets (platform rocm only), e.g. [gfx1151]')
    _t = field_validator("gpu_targets")(classmethod(lambda cls, v: check_targets(v)))

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not re.match(r"^[a-z0-9][a-z0-9._-]*$", v):
            raise ValueError(f"must be lower case letters, digits, '.', '_' or '-', got {v!r}")
        return v

    @model_validator(mode="after")
    def _platform(self) -> "StackFields":
        if self.platform == "rocm":
            if self.rocm is None:
                raise FieldError(("platform",), "platform rocm needs a `rocm:` block")
            if not self.gpu_targets:
                raise FieldError(("platform",), "platform rocm needs gpu_targets (e.g. [gfx1151])")
        for component in registry():  # in image order, each block's component's own checks
            if component.checks is not None and getattr(self, component.block_key, None) is not None:
                component.checks(self)
        if self.platform != "rocm" and self.gpu_targets:
            raise FieldError(("gpu_targets",), "gpu_targets only belongs to platform rocm")
        return self


def _block(component):
    """A block's annotation: optional where its Field's default is None (the block may be left out)."""
    return Optional[component.block] if component.field.default is None else component.block


StackModel = create_model("StackModel", __base__=StackFields, __module__=__name__,
                          **{c.block_key: (_block(c), c.field) for c in registry() if c.block is not None})
