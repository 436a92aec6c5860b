"""Ray Train (`ray:` block) for `launch --launcher ray`, in a layer of its own after the training
stack: ~600 MB that single-box and SSH+torchrun users never load, and a ray bump rebuilds only it."""

from pydantic import Field, field_validator

from toolbox.components import Component, LockPart, Model
from toolbox.components.values import check_version as _version


class Ray(Model):
    # Its own block (not an hf pin): ~600 MB of dependencies that only multi-node users need.
    version: str = Field(description="ray[train] version: added to the stack's Python lock and installed in a "
                         "layer of its own after the training stack, for `launch --launcher ray`")
    _v = field_validator("version")(classmethod(lambda cls, v: _version(v)))


COMPONENT = Component("ray", place=80,
                      block=Ray, field=Field(None, description="Ray Train for `launch --launcher ray` (unset: the image has no Ray)"),
                      applies=lambda s: s.model.ray is not None,
                      pins=lambda s: {"ray.version": s.model.ray.version}, runtime="runtime/ray.j2",
                      # in the Python lock, and what only it pulls in is its own layer
                      lock=lambda s: LockPart(requirements=(f"ray[train]=={s.model.ray.version}",), own_layer="ray"),
                      # unlocked (a stale lock), the template names hf_reqs + torch_reqs again, as hf.j2 does
                      variables=lambda s, pin_set: {"ray_req": f"ray[train]=={s.model.ray.version}"})
