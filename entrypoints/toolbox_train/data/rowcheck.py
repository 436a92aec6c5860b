"""Every dataset row checked against the chosen format before anything heavy runs, with bad rows
named as file:line (JSONL) or file row N (other files), the first few of them and a count.

JSONL is read here, streamed, before `datasets` sees it: a missing field or a value of another
type would otherwise surface as a pyarrow cast error (no line) or a traceback inside TRL.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable, Iterable

from toolbox_train.contract import UserError
from toolbox_train.data import images, pref_rows

NAMED = 5  # bad rows named in the message; the rest are counted
ROLE_KEYS = ("messages", "conversations")

Locate = Callable[[int], str]  # row index -> "file:line" (or "file row N")


def detect_format(columns: Iterable[str], text_field: str, where: str) -> str:
    columns = list(columns)
    if any(k in columns for k in ROLE_KEYS):
        return "messages"
    if "instruction" in columns and "output" in columns:
        return "alpaca"
    if text_field in columns:
        return "text"
    raise UserError(f"data.format: {where}: cannot tell the format from columns {columns}; "
                    f"expected '{text_field}', 'instruction'+'output', or 'messages'")


def row_problem(row: dict[str, Any], fmt: str, text_field: str) -> str | None:
    """What is wrong with one row for `fmt` (text, alpaca, messages; the preference formats in
    data/pref_rows.py), or None."""
    if fmt in pref_rows.FORMATS:
        return pref_rows.problem(row, fmt)
    if fmt == "text":
        v = row.get(text_field)
        if v is None:
            return f"no {text_field!r} field (text format)"
        return None if isinstance(v, str) else f"{text_field!r} must be a string, got {type(v).__name__}"
    if fmt == "alpaca":
        for key, types in (("instruction", (str,)), ("output", (str, int, float))):
            if row.get(key) is None:
                return f"no {key!r} field (alpaca format)"
            if not isinstance(row[key], types) or isinstance(row[key], bool):
                return f"{key!r} must be a string, got {type(row[key]).__name__}"
        inp = row.get("input")
        return None if inp is None or isinstance(inp, str) else f"'input' must be a string, got {type(inp).__name__}"
    key = next((k for k in ROLE_KEYS if row.get(k) is not None), None)
    msgs = row.get(key) if key else None
    if not isinstance(msgs, list) or not msgs:
        return "'messages' must be a non-empty list of {role, content}"
    for i, m in enumerate(msgs):
        if isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), list):
            why = images.parts_problem(key, i, m["role"], m["content"])  # image rows: a list of parts
            if why:
                return why
            continue
        if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
            return f"{key}[{i}] must be {{\"role\": string, \"content\": string}}"
    if images.COLUMN in row or any(isinstance(m["content"], list) for m in msgs):
        return images.count_problem(msgs, row.get(images.COLUMN))
    return None


def refuse(bad: list[tuple[str, str]], count: int, total: int, field: str) -> None:
    """Raise one UserError naming the first bad rows (`bad`: (where, why)) and counting all."""
    if not count:
        return
    where, why = bad[0]
    more = f"; {count - 1} more bad row(s), e.g. {', '.join(w for w, _ in bad[1:])}" if count > 1 else ""
    raise UserError(f"{field}: {where}: {why}{more} ({count} of {total} rows bad)")


def check_rows(rows: Iterable[dict], fmt: str, text_field: str, locate: Locate, field: str) -> None:
    bad: list[tuple[str, str]] = []
    count = total = 0
    for i, row in enumerate(rows):
        total += 1
        why = row_problem(row, fmt, text_field)
        if why:
            count += 1
            if len(bad) < NAMED:
                bad.append((locate(i), why))
    refuse(bad, count, total, field)


def _objects(path: Path):
    """(line number, object) per non-blank line; malformed JSON is refused naming the line."""
    with path.open("rb") as f:
        for n, raw in enumerate(f, 1):
            if not raw.strip():
                continue
            try:
                obj = json.loads(raw)
            except (json.JSONDecodeError, UnicodeDecodeError) as exc:
                raise UserError(f"{path}:{n}: malformed JSON line: {exc}") from None
            except RecursionError:
                raise UserError(f"{path}:{n}: malformed JSON line: nested too deeply") from None
            if not isinstance(obj, dict):
                raise UserError(f"{path}:{n}: expected a JSON object, got {type(obj).__name__}")
            yield n, obj


def renamed(row: dict[str, Any], columns: dict[str, str]) -> dict[str, Any]:
    """The row with the file's columns under the format's names (`columns`: file's -> format's)."""
    if not columns:
        return row
    out = {k: v for k, v in row.items() if k not in columns.values()}
    out.update({columns[k]: v for k, v in row.items() if k in columns})
    return out


def missing_columns(have, columns: dict[str, str], field: str, where: str) -> None:
    """A column `fields` names that the file does not have, named by its field."""
    for col, name in columns.items():
        if col not in have:
            raise UserError(f"{field.rsplit('.', 1)[0]}.fields.{name}: {where}: no column {col!r} "
                            f"(has {sorted(have)})")


def scan_jsonl(paths: list[Path], fmt: str, text_field: str, field: str,
               columns: dict[str, str] | None = None) -> tuple[str, Locate]:
    """Two streamed passes over JSONL files: syntax and columns, then every row against the
    format (detected from all rows' keys, as `datasets` unions them). Returns (format, locate).
    `columns`: the file's column -> the format's field name (data.fields)."""
    columns = columns or {}
    lines: list[tuple[Path, int]] = []
    keys: dict[str, None] = {}
    for path in paths:
        n_before = len(lines)
        for n, obj in _objects(path):
            lines.append((path, n))
            keys.update(dict.fromkeys(obj))
        if len(lines) == n_before:
            empty = path.stat().st_size == 0
            raise UserError(f"{field}: {path}: {'the file is empty' if empty else 'only blank lines'}; "
                            "expected one JSON object per line")
    missing_columns(keys, columns, field, str(paths[0]) if len(paths) == 1 else str(paths[0].parent))
    keys = renamed(keys, columns)
    if fmt == "auto":
        fmt = detect_format(keys, text_field, str(paths[0]) if len(paths) == 1 else str(paths[0].parent))

    def locate(i: int) -> str:
        path, n = lines[i]
        return f"{path}:{n}"

    bad: list[tuple[str, str]] = []
    count = 0
    for path in paths:
        for n, obj in _objects(path):
            why = row_problem(renamed(obj, columns), fmt, text_field)
            if why:
                count += 1
                if len(bad) < NAMED:
                    bad.append((f"{path}:{n}", why))
    refuse(bad, count, len(lines), field)
    return fmt, locate
