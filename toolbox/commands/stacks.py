"""`toolbox stacks`: one line per shipped stack: name, base, key pins."""

from __future__ import annotations

from toolbox.stack.load import load_stack, stack_names

KEY_PINS = ("rocm.version", "torch.version", "rccl.commit", "unsloth.version", "transformers.version")


def _short(value: str) -> str:
    return value[:12] if len(value) == 40 else value


def run(args) -> int:
    for name in stack_names():
        s = load_stack(name)
        lock = s.pins()
        pins = " ".join(f"{k.split('.')[0]}={_short(lock[k])}" for k in KEY_PINS if k in lock)
        flag = f" unverified={','.join(s.unverified_pins())}" if s.unverified_pins() else ""
        print(f"{name}\t{s.base_image}\t{pins}{flag}")
    return 0


def register(sub) -> None:
    p = sub.add_parser("stacks", help="list the shipped stacks with their base and key pins")
    p.set_defaults(func=run)
