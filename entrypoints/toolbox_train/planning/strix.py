"""Strix Halo (gfx1151) reports caught before the first step: each with its one-line fix and the public record.

What the GPU is comes from torch (`device()`), read inside the functions, never at import; every
check takes it as an argument, so the tests hand in stand-in devices. On any other GPU, or on CPU,
each check says nothing.
"""

from __future__ import annotations

import os

import re
from dataclasses import dataclass

from toolbox_train.contract import UserError

GiB = 1 << 30
# pages of 4 KiB: GiB x 262144 (AMD's Strix Halo page: ttm.pages_limit is in pages)
PAGES_PER_GIB = 262144


@dataclass(frozen=True)
class Device:
    """What torch reports of this rank's GPU: its arch (gcnArchName, "gfx1151:xnack-"), HIP's version
    (torch.version.hip), its memory (get_device_properties' total_memory) and the host's RAM."""

    arch: str | None = None
    hip: str | None = None
    total_bytes: int | None = None
    ram_bytes: int | None = None

    @property
    def gfx1151(self) -> bool:
        return (self.arch or "").split(":")[0] == "gfx1151"


def device(local_rank: int = 0) -> Device:
    """This rank's GPU as torch sees it (Device() on CPU or without a ROCm torch)."""
    try:
        import torch

        if not torch.cuda.is_available() or not torch.version.hip:
            return Device()
        props = torch.cuda.get_device_properties(local_rank)
        return Device(getattr(props, "gcnArchName", None), str(torch.version.hip), int(props.total_memory), _ram())
    except Exception:  # no driver, no device
        return Device()


def _ram(meminfo: str = "/proc/meminfo") -> int | None:
    try:
        m = re.search(r"^MemTotal:\s+(\d+) kB", open(meminfo, encoding="utf-8").read(), re.M)
    except OSError:
        return None
    return int(m.group(1)) * 1024 if m else None


def memory_hint(dev: Device) -> str | None:
    """torch sees about half the machine: the kernel's TTM limit (ttm.pages_limit) at its default, half of
    RAM. unslothai/unsloth #7878 (and its PR #7960): a 128 GB Strix Halo reported total_memory 62.47 GiB
    because amdgpu.gttsize is deprecated and the TTM page limit was still at its RAM/2 default; also
    kyuz0/vllm-toolboxes #11, ROCm/legacy-rocm-build #5444. `toolbox doctor --gpu-only` checks it on the host."""
    if not dev.gfx1151 or not dev.total_bytes or not dev.ram_bytes or dev.total_bytes > 0.6 * dev.ram_bytes:
        return None
    pages = int(dev.ram_bytes * 0.75 / GiB) * PAGES_PER_GIB
    return (f"the GPU reports {dev.total_bytes / GiB:.2f} GiB of this machine's {dev.ram_bytes / GiB:.0f} GiB: "
            "the kernel's TTM limit (ttm.pages_limit) is at its default, half of RAM (unsloth #7878); fix: "
            f"boot with ttm.pages_limit={pages} (3/4 of RAM in 4 KiB pages) on the kernel command line and reboot")


def memory_refusal(why: str | None, dev: Device | None = None) -> str | None:
    """The memory plan's refusal (planning.memory.refusal), with the TTM setting named where that is
    why the device is small."""
    if why is None:
        return None
    hint = memory_hint(dev if dev is not None else device())
    return f"{why}; {hint}" if hint else why


# The dataloader on the unified-memory APU: professor-moody/halo-forge docs/HARDWARE_NOTES.md ("Critical
# Settings ... required for stable training": dataloader_num_workers 0 and dataloader_pin_memory false;
# workers compete for the unified memory, and pinned memory is redundant where host and GPU memory are one).
IMAGE_WORKERS = 4  # image rows: the processor's resizing is host work of the order of a step (an 896 px row)


def loader(workers: int | str, gpu: bool, dev: Device | None = None, images: bool = False) -> tuple[int, bool]:
    """(dataloader_num_workers, dataloader_pin_memory) for data.loader_workers: `auto` is 0 workers and no
    pinned memory on gfx1151, 1 worker and pinned memory on other GPUs (up to IMAGE_WORKERS, at most half the
    cores, for image rows), 0 on CPU; a number is kept."""
    apu = gpu and (dev if dev is not None else device()).gfx1151
    if workers == "auto":
        workers = 0 if apu or not gpu else max(1, min(IMAGE_WORKERS, (os.cpu_count() or 2) // 2)) if images else 1
    return int(workers), gpu and not apu


def attention(configured: str | None, precision: str, dev: Device | None = None) -> str | None:
    """The attention the model loads with on gfx1151: flash_attention_2 in bf16 gives NaN losses there
    (unslothai/unsloth #3385, fixed in Unsloth by PR #3588: "On HIP (gfx1151) bfloat16 FlashAttention2 can
    be numerically unstable"; amd/playbooks #611), so it is refused. Unset stays unset: transformers'
    own default, sdpa where the model has it and eager where not (GPT-OSS), never flash_attention_2."""
    dev = dev if dev is not None else device()
    if dev.gfx1151 and configured == "flash_attention_2" and precision == "bf16":
        raise UserError("model.attn_implementation: flash_attention_2 in bf16 gives NaN losses on gfx1151 "
                        "(unsloth #3385); fix: model.attn_implementation: sdpa (or eager)")
    return configured


def nan_hint(step: int, attn: str | None, dev: Device | None = None) -> str | None:
    """Where a NaN loss at the first steps on gfx1151 most likely comes from: the attention (unsloth #3385)."""
    if step > 1 or not (dev if dev is not None else device()).gfx1151:
        return None
    return (f"on gfx1151 a NaN at step {step} is the attention's ({attn or 'the default'}) in bf16 (unsloth #3385); "
            "fix: model.attn_implementation: eager, or precision fp32 to confirm")


# torch._grouped_mm, which transformers' MoE experts (GPT-OSS, Qwen3-MoE, ...) run on a GPU: a null HIP
# kernel that kills the process on ROCm 7.12 builds (torch 2.10.0+rocm7.12.0 reports HIP 7.2.0), fixed in
# ROCm 7.13 (torch.version.hip 7.13.99...): ROCm/TheRock #5284 (seen on gfx120X; the same wheels serve
# gfx1151). The stacks on ROCm 7.13 and later (gfx1151, -rocm7.14, -rocm10.0) are past it.
GROUPED_MM_FIXED = (7, 13)


def moe_problem(model_config, dev: Device | None = None) -> str | None:
    """One line, before the weights load, where an MoE model would run torch._grouped_mm on a HIP that crashes in it."""
    dev = dev if dev is not None else device()
    mc = model_config.to_dict() if hasattr(model_config, "to_dict") else dict(model_config or {})
    mc = mc.get("text_config") or mc
    experts = mc.get("num_local_experts") or mc.get("num_experts") or mc.get("n_routed_experts")
    m = re.match(r"(\d+)\.(\d+)", dev.hip or "")
    if not experts or m is None or (int(m[1]), int(m[2])) >= GROUPED_MM_FIXED:
        return None
    return (f"this model's {experts} experts run torch._grouped_mm, which crashes on HIP {dev.hip} (ROCm before 7.13, "
            "TheRock #5284); fix: train it in an image of a stack on ROCm 7.13 or later (toolbox build --stack gfx1151-rocm10.0)")


def preflight(p, dev: Device | None = None) -> None:
    """The resolved run's gfx1151 checks that need the GPU but no weights (UserError: exit 2, before loading);
    `p`: the run (planning.run.ResolvedRun), which resolve checks on this rank's own GPU."""
    if not p.gpu:
        return
    dev = dev if dev is not None else device()
    attention(p.cfg.model.attn_implementation, p.precision, dev)
    why = moe_problem(p.model_config, dev)
    if why:
        raise UserError(why)
