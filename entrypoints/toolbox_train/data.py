"""Dataset loading: local JSONL/Parquet/CSV, a saved `datasets` folder or a hub id, in
plain-text, alpaca-style or chat-`messages` form, shaped for TRL's SFTTrainer."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .errors import UserError

SUFFIX_BUILDER = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".csv": "csv"}
ALPACA_PROMPT = "### Instruction:\n{instruction}\n\n{input_block}### Response:\n"


def resolve_local(path: str, base: Path) -> Path | None:
    p = Path(path).expanduser()
    for cand in ([p] if p.is_absolute() else [base / p, Path.cwd() / p]):
        if cand.exists():
            return cand.resolve()
    return None


def looks_like_hub_id(path: str) -> bool:
    parts = path.split("/")
    return (
        len(parts) == 2
        and all(parts)
        and not path.startswith((".", "~"))
        and Path(path).suffix.lower() not in SUFFIX_BUILDER
    )


def check_jsonl(path: Path) -> None:
    """Report the first malformed line as file:line before `datasets` gives its own traceback."""
    with path.open("rb") as f:
        for n, raw in enumerate(f, 1):
            if not raw.strip():
                continue
            try:
                obj = json.loads(raw)
            except (json.JSONDecodeError, UnicodeDecodeError) as exc:
                raise UserError(f"{path}:{n}: malformed JSON line: {exc}") from None
            if not isinstance(obj, dict):
                raise UserError(f"{path}:{n}: expected a JSON object, got {type(obj).__name__}")


def _load_file(path: Path, field: str):
    import datasets

    builder = SUFFIX_BUILDER.get(path.suffix.lower())
    if builder is None:
        raise UserError(f"{field}: {path}: unsupported file type (use .jsonl, .parquet, .csv or a datasets folder)")
    if path.suffix.lower() == ".jsonl":
        check_jsonl(path)
    try:
        return datasets.load_dataset(builder, data_files=str(path), split="train")
    except Exception as exc:  # pyarrow/pandas parse errors name no line we can trust
        raise UserError(f"{field}: {path}: could not be read as {builder}: {exc}") from None


def _load_dir(path: Path, split: str, field: str):
    import datasets

    if (path / "dataset_dict.json").exists() or (path / "state.json").exists():
        ds = datasets.load_from_disk(str(path))
        if isinstance(ds, datasets.DatasetDict):
            if split not in ds:
                raise UserError(f"{field}: {path}: no split {split!r} (has {', '.join(ds)})")
            ds = ds[split]
        return ds
    files = sorted(p for p in path.iterdir() if p.suffix.lower() in SUFFIX_BUILDER)
    if not files:
        raise UserError(f"{field}: {path}: a folder with neither a saved dataset nor data files")
    for f in files:
        if f.suffix.lower() == ".jsonl":
            check_jsonl(f)
    builder = SUFFIX_BUILDER[files[0].suffix.lower()]
    return datasets.load_dataset(builder, data_files=[str(f) for f in files], split="train")


def load_raw(path: str, split: str, base: Path, field: str = "data.path"):
    local = resolve_local(path, base)
    if local is not None:
        return _load_dir(local, split, field) if local.is_dir() else _load_file(local, field)
    if not looks_like_hub_id(path):
        raise UserError(f"{field}: {path}: no such file or folder")
    import datasets

    try:
        return datasets.load_dataset(path, split=split)
    except Exception as exc:
        raise UserError(f"{field}: {path}: not a local path, and the hub dataset could not be loaded "
                        f"(offline? set HF_HOME to a cache that has it): {exc}") from None


def detect_format(columns: list[str], text_field: str) -> str:
    if "messages" in columns or "conversations" in columns:
        return "messages"
    if "instruction" in columns and "output" in columns:
        return "alpaca"
    if text_field in columns:
        return "text"
    raise UserError(f"data.format: cannot tell the format from columns {columns}; "
                    f"expected '{text_field}', 'instruction'+'output', or 'messages'")


def _alpaca(row: dict[str, Any]) -> dict[str, str]:
    inp = (row.get("input") or "").strip()
    return {
        "prompt": ALPACA_PROMPT.format(
            instruction=row["instruction"], input_block=f"### Input:\n{inp}\n\n" if inp else ""
        ),
        "completion": str(row["output"]),
    }


def shape(ds, fmt: str, text_field: str, path: str):
    """Map rows to what SFTTrainer expects: `text`, `prompt`+`completion`, or `messages`."""
    cols = list(ds.column_names)
    if fmt == "auto":
        fmt = detect_format(cols, text_field)
    if fmt == "text":
        if text_field not in cols:
            raise UserError(f"data.text_field: {path}: no column {text_field!r} (has {cols})")
        ds = ds.select_columns([text_field])
        return (ds.rename_column(text_field, "text") if text_field != "text" else ds), fmt
    if fmt == "alpaca":
        missing = [c for c in ("instruction", "output") if c not in cols]
        if missing:
            raise UserError(f"data.format: alpaca: {path}: missing column(s) {missing} (has {cols})")
        return ds.map(_alpaca, remove_columns=cols), fmt
    key = "messages" if "messages" in cols else "conversations" if "conversations" in cols else None
    if key is None:
        raise UserError(f"data.format: messages: {path}: no 'messages' column (has {cols})")
    ds = ds.select_columns([key])
    if key != "messages":
        ds = ds.rename_column(key, "messages")
    bad = next((i for i, m in enumerate(ds["messages"]) if not isinstance(m, list) or not m
                or not all(isinstance(x, dict) and "role" in x and "content" in x for x in m)), None)
    if bad is not None:
        raise UserError(f"data: {path}: row {bad + 1}: 'messages' must be a list of {{role, content}}")
    return ds, fmt


def load_datasets(cfg, base: Path):
    """(train, eval or None, format) for the config's `data` section."""
    d = cfg.data
    train = load_raw(d.path, d.split, base)
    if len(train) == 0:
        raise UserError(f"data.path: {d.path}: the dataset is empty")
    train, fmt = shape(train, d.format, d.text_field, d.path)
    evald = None
    if d.eval_path:
        evald, _ = shape(load_raw(d.eval_path, d.split, base, "data.eval_path"), fmt, d.text_field, d.eval_path)
    elif d.eval_split > 0:
        parts = train.train_test_split(test_size=d.eval_split, seed=cfg.train.seed)
        train, evald = parts["train"], parts["test"]
    return train, evald, fmt
