"""train.yaml's validation errors (pydantic's) as one line: each at its field's line in the file, or on
the `--set` item that wrote it; a field of several types (`auto` or a number) once, with every form
it takes."""

from __future__ import annotations

import re
from typing import Sequence

from pydantic import ValidationError

# pydantic names the failed branch of a union as the last part of the error's location
_BRANCH = re.compile(r"literal\[.*\]|(?:constrained-)?(int|float|bool|str)")
_KIND = {"int": "an integer", "float": "a number", "bool": "true or false", "str": "a string"}
_FORMS = "\x00forms\x00"  # where a union field's forms go once all its branches are read


def union_branch(loc: tuple) -> bool:
    return len(loc) > 1 and isinstance(loc[-1], str) and _BRANCH.fullmatch(loc[-1]) is not None


def expected(err: dict) -> str:
    """What the union branch of `err` accepts: 'an integer', "'auto'", 'an integer greater than ... 1'."""
    m = _BRANCH.fullmatch(err["loc"][-1])
    rest = err["msg"].removeprefix("Input should be ")
    if m.group(1) is None:  # a literal: pydantic lists its values
        return rest
    if err["type"] == "finite_number":
        return "a finite number"
    if err["type"].endswith(("_parsing", "_type")):
        return _KIND[m.group(1)]
    return f"{_KIND[m.group(1)]} {rest}"  # a constraint of that type (ge=1: 'greater than or equal to 1')


def set_item(field: str, overrides: Sequence[str]) -> str | None:
    """The `--set` item (the last, which wins) that wrote `field`, or the section `field` is in, or
    created `field` as a section (`--set nosuch.key=1` makes the unknown section `nosuch`)."""
    found = None
    for item in overrides:
        k = item.partition("=")[0].strip()
        if field == k or field.startswith(k + ".") or k.startswith(field + "."):
            found = item
    return found


def fmt_errors(exc: ValidationError, source: str, marks: dict[tuple, tuple[int, int]],
               overrides: Sequence[str] = ()) -> str:
    """Every error on one line ('; ' between them), each at its field's line, or on `--set`
    (naming the item) when the value came from one."""
    lines: list[str] = []
    merged: dict[str, tuple[int, list[str]]] = {}  # a union field's line and the forms its branches expect
    for err in exc.errors():
        loc = ".".join(str(x) for x in err["loc"]) or "(top)"
        # The line of the field, or of the nearest section that holds it (a missing key).
        path = tuple(err["loc"])
        while path and path not in marks:
            path = path[:-1]
        where = f"{source}:{marks[path][0]}" if path in marks else source
        item = set_item(loc, overrides) if err["loc"] else None
        if item is not None:
            where = "--set"
        if union_branch(err["loc"]):  # one line for the field, every form it may take
            loc = ".".join(str(x) for x in err["loc"][:-1])
            if loc in merged:
                merged[loc][1].append(expected(err))
                continue
            merged[loc] = (len(lines), [expected(err)])
            line = f"{where}: {loc}: expected {_FORMS} (got {err.get('input')!r})"
        elif err["type"] == "extra_forbidden":
            line = f"{where}: {loc}: unknown key"
        elif err["type"] == "missing":
            line = f"{where}: {loc}: required"
        elif err["type"] == "value_error":  # a validator's own words
            line = f"{where}: {loc}: {err['ctx']['error']}"
        elif err["type"] == "finite_number":
            line = f"{where}: {loc}: not a finite number (got {err.get('input')!r})"
        else:
            line = f"{where}: {loc}: {err['msg']} (got {err.get('input')!r})"
        lines.append(f"{line} (from --set {item})" if item is not None else line)
    for i, forms in merged.values():
        lines[i] = lines[i].replace(_FORMS, " or ".join(forms), 1)
    return "; ".join(lines)
