"""PyTorch (+ torchvision, torchaudio) at exact versions from the stack's index."""

from toolbox.components import Component


def requirements(stack) -> list[str]:
    t = stack.torch
    reqs = [f"torch=={t.torch}"]
    if t.torchvision:
        reqs.append(f"torchvision=={t.torchvision}")
    if t.torchaudio:
        reqs.append(f"torchaudio=={t.torchaudio}")
    return reqs


def _pins(stack):
    t = stack.torch
    pins = {"torch.version": t.torch}
    if t.torchvision:
        pins["torchvision.version"] = t.torchvision
    if t.torchaudio:
        pins["torchaudio.version"] = t.torchaudio
    if t.index_url:
        pins["torch.index_url"] = t.index_url
    return pins


COMPONENT = Component("torch", applies=lambda s: True, pins=_pins, runtime="runtime/torch.j2",
                      variables=lambda s, lock: {"torch_reqs": requirements(s)})
