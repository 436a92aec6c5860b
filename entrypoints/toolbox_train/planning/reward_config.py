"""A reward entry of a section's `rewards` (the objectives that score completions: GRPO, RLOO), as
train.yaml writes it: a built-in (format, length, python_tests: the sandbox's), `module:function`,
or a reward model's folder; planning/rewards.py resolves and tries them."""

from __future__ import annotations

import re

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from toolbox_train.sandbox.limits import Limits

BUILTIN_REWARDS = ("format", "length", "python_tests")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True, frozen=True)


class RewardCfg(_Strict):
    function: str | None = Field(None, description="format, length, python_tests, or module:function (a module.py "
                                 "beside the config, or an installed module)")
    model: str | None = Field(None, description="or a reward model: a folder of a sequence-classification model with "
                              "one label (a run that trained a reward model), its score of prompt + completion")
    weight: float = 1.0
    pattern: str | None = Field(None, description="format: a regex the completion must contain (re.search)")
    max_chars: int | None = Field(None, gt=0, description="length: completions longer than this are penalized")
    sandbox: Limits | None = Field(None, description="python_tests: the sandbox's limits (docs/preference.md)")

    @field_validator("pattern")
    @classmethod
    def _regex(cls, v):
        if v is not None:
            try:
                re.compile(v)
            except re.error as exc:
                raise ValueError(f"not a regular expression: {exc}") from None
        return v

    @model_validator(mode="after")
    def _shape(self):
        f = self.function
        if (f is None) == (self.model is None):
            raise ValueError("give function or model (one of them)")
        if f != "python_tests" and self.sandbox is not None:
            raise ValueError("sandbox belongs to the python_tests reward")
        if self.model is not None:
            if self.pattern is not None or self.max_chars is not None:
                raise ValueError("pattern belongs to the format reward, max_chars to the length reward")
            return self
        if f == "format" and self.pattern is None:
            raise ValueError("the format reward needs `pattern`")
        if f == "length" and self.max_chars is None:
            raise ValueError("the length reward needs `max_chars`")
        if f not in BUILTIN_REWARDS and not re.fullmatch(r"[A-Za-z_][\w.]*:[A-Za-z_]\w*", f):
            raise ValueError(f"{f!r}: expected format, length, python_tests or module:function")
        if (f != "format" and self.pattern is not None) or (f != "length" and self.max_chars is not None):
            raise ValueError("pattern belongs to the format reward, max_chars to the length reward")
        return self
