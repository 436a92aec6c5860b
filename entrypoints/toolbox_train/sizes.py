"""Sizes in bytes as people write and read them: the one parser and the one printer of both packages
(the host's `toolbox build` prints an image's size with it)."""

from __future__ import annotations

import re


def parse_size(text: str, *, decimal: bool = True) -> int:
    """'128GiB', '128G' (binary), '137GB', '1.5TiB', '64K' or plain bytes -> bytes. `decimal`: an
    SI 'GB' is 10^9 (memory sizes as vendors write them); else 2^30, as rccl-tests read sizes.
    ValueError naming the text otherwise."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([KMGT]?)(i?)(B?)\s*", str(text), re.IGNORECASE)
    if not m or (m.group(3) and not m.group(2)):
        raise ValueError(f"{text!r}: expected a size like 128GiB, 96GB or 64G")
    num, unit = float(m.group(1)), m.group(2).upper()
    si = decimal and bool(m.group(4)) and not m.group(3)  # GB: 10^9; GiB and bare G: 2^30
    return int(num * (1000 if si else 1024) ** ("KMGT".find(unit) + 1)) if unit else int(num)


def human_size(n: float) -> str:
    """Bytes as '512 B', '1.5 KiB', ... up to TiB."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"
