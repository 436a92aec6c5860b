"""How GRPO generates its completions (`grpo.generation`): transformers' `generate` (TRL's default)
or TRL's vLLM colocate mode (`use_vllm`, `vllm_mode: colocate`: a vLLM engine in the training
process, on the same GPU, its share of memory `grpo.vllm_gpu_memory_utilization`).

vLLM's PyPI wheels are CUDA builds, each pinned to one torch (vLLM 0.31.0 and 0.32.0: torch==2.13.0,
the cuda stack's; 0.33.0 and 0.34.0: torch==2.14.0); TRL 1.15 declares vLLM 0.21.0-0.31.0 supported
(its `vllm` extra and `is_vllm_available`). `refusal` reads the installed vLLM's own metadata
before the model loads, so a missing or mismatched vLLM is exit 2 and not a crash inside TRL.
"""

from __future__ import annotations

import importlib
from importlib.metadata import PackageNotFoundError, requires, version

GENERATION = ("transformers", "vllm-colocate")
VLLM_FOR_TRL = "0.31.0"  # the newest vLLM TRL 1.15 declares supported; the `vllm` extra pins it


def _torch_pin() -> str | None:
    """The installed vLLM's own requirement on torch (`Requires-Dist: torch==...`), or None."""
    from packaging.requirements import InvalidRequirement, Requirement

    for line in requires("vllm") or []:
        try:
            req = Requirement(line)
        except InvalidRequirement:
            continue
        if req.name.lower() == "torch" and (req.marker is None or req.marker.evaluate({"extra": ""})):
            return str(req.specifier)
    return None


def refusal(cfg, backend: str, gpu: bool) -> str | None:
    """Why `grpo.generation: vllm-colocate` cannot run here (one line naming the field), or None.
    The installed packages first (what an image fixes), then the machine."""
    if cfg.objective != "grpo" or cfg.grpo.generation == "transformers":
        return None
    field = "grpo.generation: vllm-colocate"
    try:
        have = version("vllm")
    except PackageNotFoundError:
        return (f"{field} needs vLLM, which is not installed (on the cuda stack: pip install "
                f"'vllm=={VLLM_FOR_TRL}', the `vllm` extra; docs/preference.md); or use generation: transformers")
    from packaging.specifiers import SpecifierSet
    from packaging.version import Version

    torch_have = version("torch")
    pin = _torch_pin()
    if pin and not SpecifierSet(pin).contains(Version(torch_have), prereleases=True):
        return (f"{field}: vLLM {have} requires torch{pin}, the installed torch is {torch_have}; install the vLLM "
                f"release built for this torch (vLLM 0.31.0 and 0.32.0 pin torch 2.13.0, the cuda stack's) "
                f"or use generation: transformers")
    if backend == "unsloth":
        # Unsloth's patched GRPOTrainer takes the vLLM engine of a model loaded with fast_inference,
        # which finetune does not load; TRL's own colocate mode runs on the hf backend
        return f"{field} runs TRL's colocate mode on backend hf (backend: auto picks it); backend is unsloth"
    if not gpu:
        return f"{field} generates on a CUDA GPU and this run is on the CPU; use generation: transformers"
    import torch

    if torch.version.cuda is None:
        return (f"{field}: vLLM's PyPI wheels are CUDA builds and this torch ({torch_have}) is not "
                f"(ROCm: {torch.version.hip}); use generation: transformers")
    try:
        importlib.import_module("vllm")
    except Exception as exc:  # a broken install: say so now, not after the model has loaded
        from toolbox_train.contract import first_line

        return f"{field}: vLLM {have} is installed but does not import: {first_line(exc)}"
    return None


def trl_kwargs(g) -> dict:
    """GRPOConfig's generation arguments for the `grpo` section `g`."""
    if g.generation == "transformers":
        return {"use_vllm": False}
    kw = {"use_vllm": True, "vllm_mode": "colocate"}
    if g.vllm_gpu_memory_utilization is not None:
        kw["vllm_gpu_memory_utilization"] = g.vllm_gpu_memory_utilization
    return kw
