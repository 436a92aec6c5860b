#!/usr/bin/env python3
"""Fail a build when a freshly built librccl would not satisfy the libraries that load it.

    python3 abicheck.py --provider librccl.so.1 --consumer libtorch_hip.so [--consumer ...]

Every nccl*/rccl* symbol a consumer imports (an undefined dynamic symbol) must be
exported (defined, global or weak, default or protected visibility) by the provider.
Exit 0 when that holds, 1 with the list of missing symbols, 2 for unusable input.
A prebuilt librccl copied over torch's bundled one broke `import torch` with
`undefined symbol: ncclCommResume`; this turns that into a build failure.

Stdlib only: it runs inside the image, where binutils may not be installed, so it
reads the ELF .dynsym table itself instead of calling `nm -D`.
"""

from __future__ import annotations

import argparse
import re
import struct
import sys
from dataclasses import dataclass, field
from pathlib import Path

SHT_DYNSYM = 11
SHN_UNDEF = 0
STB_GLOBAL, STB_WEAK, STB_GNU_UNIQUE = 1, 2, 10
STV_DEFAULT, STV_PROTECTED = 0, 3
DEFAULT_PATTERN = r"^(nccl|rccl)"


class ElfError(Exception):
    """The file is not an ELF object this tool can read."""


@dataclass
class DynSymbols:
    path: Path
    exported: set[str] = field(default_factory=set)
    imported: set[str] = field(default_factory=set)
    imported_weak: set[str] = field(default_factory=set)


def read_dynsyms(path: Path) -> DynSymbols:
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ElfError(f"{path}: cannot read: {exc.strerror}") from None
    if data[:4] != b"\x7fELF":
        raise ElfError(f"{path}: not an ELF file")
    ei_class, ei_data = data[4], data[5]
    if ei_class not in (1, 2) or ei_data not in (1, 2):
        raise ElfError(f"{path}: unknown ELF class/encoding ({ei_class}, {ei_data})")
    is64 = ei_class == 2
    end = "<" if ei_data == 1 else ">"
    try:
        if is64:
            e_shoff, = struct.unpack_from(end + "Q", data, 0x28)
            e_shentsize, e_shnum = struct.unpack_from(end + "HH", data, 0x3A)
            sh_fmt, sym_fmt = end + "IIQQQQIIQQ", end + "IBBHQQ"
        else:
            e_shoff, = struct.unpack_from(end + "I", data, 0x20)
            e_shentsize, e_shnum = struct.unpack_from(end + "HH", data, 0x2E)
            sh_fmt, sym_fmt = end + "IIIIIIIIII", end + "IIIBBH"
        if e_shoff == 0 or e_shnum == 0:
            raise ElfError(f"{path}: no section headers (cannot find .dynsym)")
        sections = [struct.unpack_from(sh_fmt, data, e_shoff + i * e_shentsize) for i in range(e_shnum)]
        out = DynSymbols(path)
        found = False
        for sh in sections:
            # (name, type, flags, addr, offset, size, link, info, addralign, entsize)
            if sh[1] != SHT_DYNSYM:
                continue
            found = True
            offset, size, link, entsize = sh[4], sh[5], sh[6], sh[9]
            str_off, str_size = sections[link][4], sections[link][5]
            strtab = data[str_off:str_off + str_size]
            entsize = entsize or struct.calcsize(sym_fmt)
            for i in range(1, size // entsize):  # entry 0 is the null symbol
                fields = struct.unpack_from(sym_fmt, data, offset + i * entsize)
                if is64:
                    st_name, st_info, st_other, st_shndx = fields[0], fields[1], fields[2], fields[3]
                else:
                    st_name, st_info, st_other, st_shndx = fields[0], fields[3], fields[4], fields[5]
                name = strtab[st_name:strtab.index(b"\0", st_name)].decode("utf-8", "replace")
                bind, vis = st_info >> 4, st_other & 0x3
                if not name or bind not in (STB_GLOBAL, STB_WEAK, STB_GNU_UNIQUE):
                    continue
                if st_shndx == SHN_UNDEF:
                    (out.imported_weak if bind == STB_WEAK else out.imported).add(name)
                elif vis in (STV_DEFAULT, STV_PROTECTED):
                    out.exported.add(name)
    except (struct.error, IndexError, ValueError) as exc:
        raise ElfError(f"{path}: truncated or malformed ELF ({exc})") from None
    if not found:
        raise ElfError(f"{path}: no .dynsym section (a static archive or stripped of section headers?)")
    return out


@dataclass
class Result:
    missing: dict[str, list[str]]        # symbol -> consumers that need it
    missing_weak: dict[str, list[str]]   # weak imports: the consumer copes without them
    checked: int


def check(provider: Path, consumers: list[Path], pattern: str = DEFAULT_PATTERN) -> Result:
    rx = re.compile(pattern)
    prov = read_dynsyms(provider)
    missing: dict[str, list[str]] = {}
    missing_weak: dict[str, list[str]] = {}
    checked: set[str] = set()
    for consumer in consumers:
        cons = read_dynsyms(consumer)
        for names, sink in ((cons.imported, missing), (cons.imported_weak, missing_weak)):
            for name in sorted(n for n in names if rx.search(n)):
                checked.add(name)
                if name not in prov.exported:
                    sink.setdefault(name, []).append(str(consumer))
    return Result(missing, missing_weak, len(checked))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="rccl-abi-check", description=__doc__.split("\n\n")[0])
    ap.add_argument("--provider", required=True, type=Path, help="the new librccl.so")
    ap.add_argument("--consumer", required=True, action="append", type=Path,
                    help="a library that loads it (repeatable), e.g. torch/lib/libtorch_hip.so")
    ap.add_argument("--pattern", default=DEFAULT_PATTERN,
                    help=f"regex for the symbols that must match (default {DEFAULT_PATTERN!r})")
    ap.add_argument("--allow-empty", action="store_true",
                    help="pass even when the consumers import no matching symbol")
    args = ap.parse_args(argv)
    try:
        res = check(args.provider, args.consumer, args.pattern)
    except ElfError as exc:
        print(f"rccl-abi-check: error: {exc}", file=sys.stderr)
        return 2
    except re.error as exc:
        print(f"rccl-abi-check: error: --pattern: {exc}", file=sys.stderr)
        return 2
    for name, who in sorted(res.missing_weak.items()):
        print(f"rccl-abi-check: warning: weak import {name} (by {', '.join(who)}) "
              f"not exported by {args.provider}", file=sys.stderr)
    if res.missing:
        print(f"rccl-abi-check: FAIL: {args.provider} lacks {len(res.missing)} symbol(s) "
              f"its consumers import:", file=sys.stderr)
        for name, who in sorted(res.missing.items()):
            print(f"  {name}  (needed by {', '.join(who)})", file=sys.stderr)
        return 1
    if res.checked == 0 and not args.allow_empty:
        # A vacuous pass would hide a wrong consumer path or a torch that links RCCL statically.
        print(f"rccl-abi-check: error: the consumers import no symbol matching {args.pattern!r}; "
              "nothing was checked (wrong --consumer? use --allow-empty to accept)", file=sys.stderr)
        return 2
    print(f"rccl-abi-check: OK: all {res.checked} imported symbol(s) matching {args.pattern!r} "
          f"are exported by {args.provider}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
