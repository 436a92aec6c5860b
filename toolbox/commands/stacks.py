"""`toolbox stacks`: one line per shipped stack: name, base, key pins (the ROCm tarball's sha256
where it is pinned), the pins still unverified, and which one commands use when none is named."""

from __future__ import annotations

from toolbox.paths import DEFAULT_STACK
from toolbox.stack.load import load_stack, stack_names

KEY_PINS = ("rocm.version", "torch.version", "rccl.commit", "unsloth.version", "transformers.version")


def _short(value: str) -> str:
    return value[:12] if len(value) == 40 else value


def run(args) -> int:
    for name in stack_names():
        s = load_stack(name)
        lock = s.pins()
        pins = " ".join(f"{k.split('.')[0]}={_short(lock[k])}" for k in KEY_PINS if k in lock)
        if lock.get("rocm.tarball.sha256", "unverified") != "unverified":
            pins += f" rocm.sha256={lock['rocm.tarball.sha256']}"
        flag = f" unverified={','.join(s.unverified_pins())}" if s.unverified_pins() else ""
        default = "\t(default)" if name == DEFAULT_STACK else ""
        print(f"{name}\t{s.base_image}\t{pins}{flag}{default}")
    return 0


def register(sub) -> None:
    p = sub.add_parser("stacks", help="list the shipped stacks with their base and key pins")
    p.set_defaults(func=run)
