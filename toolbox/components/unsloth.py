"""Unsloth and unsloth_zoo: from pinned git commits (+ patches applied in the build) or PyPI.

PyPI's unsloth/unsloth_zoo wheels (2026.10.9) require torch, torchvision, triton, xformers and
bitsandbytes outright. On a ROCm image those come from elsewhere, so `left_out()` names them: the
Python lock leaves them out of its resolution (the image installs the lock --no-deps), an
unlocked build installs the two wheels --no-deps and then their requirements less these, and
the final `pip check` lets only xformers be missing.
"""

from typing import Literal, Optional

from pydantic import Field, field_validator, model_validator

from toolbox.components import Component, ContextFile, LockPart, Model, git_bump
from toolbox.components.values import (
    check_commit as _commit, check_sha256 as _sha256, check_url as _url, check_version as _version,
)
from toolbox.paths import PROJECT_ROOT

REQUIRES = PROJECT_ROOT / "dockerfiles" / "scripts" / "requires.py"


def _pins(stack):
    u = stack.model.unsloth
    pins = {"unsloth.version": u.version, "unsloth_zoo.version": u.zoo_version}
    if u.source == "git":
        pins["unsloth.commit"] = u.commit
        pins["unsloth_zoo.commit"] = u.zoo_commit
    for i, p in enumerate(u.patches):
        pins[f"unsloth.patches.{i}"] = p.sha256 or p.file
    return pins


def wheel_name(dist: str, version: str) -> str:
    return f"{dist}-{version}-py3-none-any.whl"


def patches(stack) -> list[dict]:
    """Each patch in order: its name in the context, and its file (checked at load) or URL + sha256."""
    out, files = [], iter(stack.unsloth_patches)
    for i, p in enumerate(stack.model.unsloth.patches):
        if p.file is not None:
            f = next(files)
            out.append({"name": f"{i:02d}-{f.name}", "url": None, "sha256": None, "src": f})
        else:
            out.append({"name": f"{i:02d}-url.patch", "url": p.url, "sha256": p.sha256, "src": None})
    return out


def left_out(stack) -> dict[str, str]:
    """What PyPI Unsloth requires that a ROCm image does not take from PyPI: {name: why}, sorted
    (torch, torchvision, torchaudio are the stack's own torch pins: stack.python_lock.first_use)."""
    m = stack.model
    u = m.unsloth
    if m.platform != "rocm" or u is None or u.source != "pypi":
        return {}
    out = {
        # TheRock's Linux torch wheels require triton==<ver>+rocm<ROCm> from the same index (the
        # wheel is named `triton` since TheRock 2479212f, 2025-12-17; before, pytorch-triton-rocm):
        # PyPI's triton (CUDA) would overwrite that `triton` package.
        "triton": "the ROCm torch's own, from its index",
        # PyPI's xformers wheels are CUDA builds (xformers/_C.so); without xformers Unsloth uses
        # torch's SDPA (unsloth/models/_utils.py: ModuleNotFoundError -> xformers = None).
        "xformers": "PyPI's are CUDA builds; Unsloth uses torch's SDPA without it",
    }
    if m.bitsandbytes is not None and m.bitsandbytes.source == "git":
        out["bitsandbytes"] = "the stack builds it from git for its GPU targets"
    return dict(sorted(out.items()))


def missing_ok(stack) -> list[str]:
    """What the final `pip check` may find missing: xformers, which nothing installs on ROCm."""
    return [n for n in left_out(stack) if n == "xformers"]


def _requirements(stack) -> tuple[list[str], list[str]]:
    u = stack.model.unsloth
    extras = f"[{','.join(sorted(u.extras))}]" if u.extras else ""
    if u.source == "git":
        wheels = [wheel_name("unsloth", u.version), wheel_name("unsloth_zoo", u.zoo_version)]
        reqs = [
            f'"unsloth{extras} @ file:///opt/toolbox/wheels/unsloth/{wheels[0]}"',
            f'"unsloth_zoo @ file:///opt/toolbox/wheels/unsloth/{wheels[1]}"',
        ]
        return reqs, wheels
    return [f'"unsloth{extras}=={u.version}"', f"unsloth_zoo=={u.zoo_version}"], []


def _variables(stack, pin_set):
    reqs, wheels = _requirements(stack)
    return {"unsloth_reqs": reqs, "unsloth_wheels": wheels, "unsloth_patches": patches(stack),
            "unsloth_left_out": left_out(stack)}


def _context(stack):
    listed = patches(stack)
    # An unlocked ROCm build installs PyPI Unsloth's requirements less left_out() (runtime/unsloth.j2).
    script = [ContextFile("scripts/requires.py", src=REQUIRES)] if left_out(stack) else []
    if not listed:
        return script
    # .keep: the folder exists even when every patch comes by URL (fetched in the build).
    return script + [ContextFile(f"patches/unsloth/{p['name']}", src=p["src"]) for p in listed if p["src"]] + [
        ContextFile("patches/unsloth/.keep", text="")]


def _lock(stack) -> LockPart:
    """PyPI Unsloth is in the Python lock, less left_out(); a git build's wheels are not."""
    u = stack.model.unsloth
    extras = f"[{','.join(sorted(u.extras))}]" if u.extras else ""
    reqs = (f"unsloth{extras}=={u.version}", f"unsloth-zoo=={u.zoo_version}") if u.source == "pypi" else ()
    return LockPart(requirements=reqs, left_out=left_out(stack))


def _git(stack) -> bool:
    return stack.model.unsloth.source == "git"


class PatchRef(Model):
    """A patch applied to a source tree: a file in the repo, or an upstream diff by URL + sha256."""

    file: Optional[str] = Field(None, description='a patch file, relative to the stack file or the project')
    url: Optional[str] = Field(None, description='an upstream diff URL (needs sha256)')
    sha256: Optional[str] = Field(None, description="the sha256 of the diff behind url")
    _s = field_validator("sha256")(classmethod(lambda cls, v: _sha256(v)))

    @model_validator(mode="after")
    def _one(self) -> "PatchRef":
        if (self.file is None) == (self.url is None):
            raise ValueError("give exactly one of `file` or `url`")
        if self.url is not None:
            _url(self.url)
            if self.sha256 is None:
                raise ValueError("a patch by url needs its sha256")
        return self


class Unsloth(Model):
    source: Literal["git", "pypi"] = Field(description='git: wheels built from pinned commits (patches applied); pypi: released versions')
    version: str = Field(description='unsloth version (names its wheel with source: git)')
    zoo_version: str = Field(description='unsloth_zoo version')
    repo: str = Field("https://github.com/unslothai/unsloth", description='unsloth git URL')
    commit: Optional[str] = Field(None, description='40-hex unsloth commit (source: git)')
    zoo_repo: str = Field("https://github.com/unslothai/unsloth-zoo", description='unsloth-zoo git URL')
    zoo_commit: Optional[str] = Field(None, description='40-hex unsloth-zoo commit (source: git)')
    extras: list[str] = Field(default_factory=list, description='unsloth extras to install, e.g. [huggingfacenotorch]')
    patches: list[PatchRef] = Field(default_factory=list, description='patches applied to unsloth before its wheel is built (source: git)')
    unverified: bool = Field(False, description='true while the pins are not verified')
    _v = field_validator("version", "zoo_version")(classmethod(lambda cls, v: _version(v)))
    _c = field_validator("commit", "zoo_commit")(classmethod(lambda cls, v: None if v is None else _commit(v)))

    @model_validator(mode="after")
    def _git_needs_commits(self) -> "Unsloth":
        if self.source == "git" and (self.commit is None or self.zoo_commit is None):
            raise ValueError("source: git needs `commit` and `zoo_commit` (40-hex)")
        if self.source == "pypi" and self.patches:
            raise ValueError("patches apply to a source: git build; source: pypi installs the released wheels")
        return self


COMPONENT = Component(
    "unsloth", place=60,
    block=Unsloth, field=Field(None, description='Unsloth and unsloth_zoo'),
    applies=lambda s: s.model.unsloth is not None, pins=_pins,
    builder="stages/unsloth.j2", runtime="runtime/unsloth.j2",
    builds=_git, needs_devel=_git, variables=_variables, context=_context, lock=_lock,
    exports=lambda s: {"missing_ok": missing_ok(s)},  # what the final pip check may find missing
    bumps={"unsloth": git_bump("unsloth"), "unsloth_zoo": git_bump("unsloth", "zoo_repo", "zoo_commit", unverified=False)},
)
