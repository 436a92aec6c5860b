"""What the results record about the machine: package versions and the device."""

from __future__ import annotations

import contextlib
import sys
from typing import Any

from toolbox_train.models.arithmetic import GiB
from toolbox_train.bench.shapes import BenchError


def versions() -> dict[str, str]:
    from importlib import metadata

    v = {"python": sys.version.split()[0]}
    for d in ("torch", "transformers", "trl", "peft", "accelerate", "datasets", "unsloth", "unsloth_zoo",
              "liger-kernel", "bitsandbytes", "triton", "toolbox-train"):
        with contextlib.suppress(metadata.PackageNotFoundError):
            v[d] = metadata.version(d)
    with contextlib.suppress(Exception):
        import torch

        v["cuda"] = str(torch.version.cuda)
    return v


def device_info(device: str) -> dict:
    info: dict[str, Any] = {"device": device}
    if device.startswith("cuda"):
        import torch

        if not torch.cuda.is_available():
            raise BenchError("--device cuda: no CUDA/ROCm device is visible (use --device cpu)")
        p = torch.cuda.get_device_properties(0)
        info.update(name=p.name, memory_gib=round(p.total_memory / GiB, 1))
    else:
        import platform

        info.update(name=platform.processor() or platform.machine())
    return info
