"""Lets PyPI's torchvision import beside a CPU torch (copied into the venv by .ci/setup, with a .pth line).

Why: transformers 5.17's Qwen-VL processors need a video processor, which needs torchvision
(tests/train/test_vision.py). The venv's torch is a +cpu build; PyPI's torchvision wheels are CUDA
builds, and PyTorch's CPU index (download.pytorch.org) may not answer (it does not in CI). PyPI's
matching torchvision (0.28.0 for torch 2.13) then fails to import: its C extension cannot load with
the CPU torch, and torchvision/_meta_registrations.py's unconditional
`torch.library.register_fake("torchvision::nms")` (and qnms) raises "operator torchvision::nms does not
exist". Defining those two operator schemas first makes it import; its pure-Python transforms (all the
Qwen-VL image and video processors use) work. Its C ops (nms, roi_align, deform_conv2d, image decoding
...) stay unavailable on this build: calling one raises.

The finder acts only when `torchvision` is first imported (then it imports torch): nothing is
imported at interpreter start, which every python subprocess pays.
"""

from __future__ import annotations

import sys

_SCHEMAS = ("nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
            "qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
_library = None  # kept alive: a torch.library.Library removes its definitions when collected


class _Finder:
    """A sys.meta_path entry that defines the schemas before torchvision's own import, then steps aside."""

    def find_spec(self, name, path=None, target=None):
        if name != "torchvision":
            return None
        global _library
        sys.meta_path[:] = [f for f in sys.meta_path if f is not self]
        import torch

        if torch.version.cuda is None and torch.version.hip is None:  # a CPU torch: the C extension cannot load
            _library = torch.library.Library("torchvision", "DEF")
            for schema in _SCHEMAS:
                _library.define(schema)
        return None  # the ordinary finders import torchvision


def install() -> None:
    if not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder())
