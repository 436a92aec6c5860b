"""Ray Train (`ray:` block) for `launch --launcher ray`, in a layer of its own after the training
stack: ~600 MB that single-box and SSH+torchrun users never load, and a ray bump rebuilds only it."""

from toolbox.components import Component


COMPONENT = Component("ray", applies=lambda s: s.ray is not None,
                      pins=lambda s: {"ray.version": s.ray.version}, runtime="runtime/ray.j2",
                      # unlocked (a stale lock), the template names hf_reqs + torch_reqs again, as hf.j2 does
                      variables=lambda s, pin_set: {"ray_req": f"ray[train]=={s.ray.version}"})
