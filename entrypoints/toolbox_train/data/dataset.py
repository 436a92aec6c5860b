"""Dataset loading: local JSONL/Parquet/CSV, a saved `datasets` folder or a hub id, in
plain-text, alpaca-style or chat-`messages` form, shaped for TRL's SFTTrainer; one `data.path`, or
a mixture of several sources (`data.sources`, at the end of this module)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Callable

from toolbox_train.contract import UserError, first_line
from toolbox_train.guards import special_file
from toolbox_train.data import images, pref_rows
from toolbox_train.units import registry
from toolbox_train.data.rowcheck import NAMED, Locate, check_rows, detect_format, missing_columns, refuse, scan_jsonl

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


def _read(builder: str, files: list[Path], field: str):
    import datasets

    try:
        return datasets.load_dataset(builder, data_files=[str(f) for f in files], split="train")
    except Exception as exc:  # pyarrow/pandas parse errors name no line we can trust
        reason = first_line(exc)
        raise UserError(f"{field}: {files[0]}: could not be read as {builder}: {reason}") from None


def _files_of(path: Path, field: str) -> list[Path]:
    if path.is_dir():
        files = sorted(p for p in path.iterdir() if p.suffix.lower() in SUFFIX_BUILDER)
        if not files:
            raise UserError(f"{field}: {path}: a folder with neither a saved dataset nor data files")
    elif path.suffix.lower() not in SUFFIX_BUILDER:
        raise UserError(f"{field}: {path}: unsupported file type (use .jsonl, .parquet, .csv or a datasets folder)")
    else:
        files = [path]
    for f in files:
        kind = special_file(f)
        if kind:  # reading a FIFO blocks until a writer comes: never open one
            raise UserError(f"{field}: {f}: {kind}, not a regular file (it is not read)")
    return files


SAVED_JSON = ("dataset_dict.json", "state.json", "dataset_info.json")  # what save_to_disk writes beside the data


def _load_saved(path: Path, split: str, field: str):
    import datasets

    not_saved = f"{field}: {path}: not a readable saved dataset (save_to_disk's folder)"
    # datasets reads these with json.load and says only "JSONDecodeError": name the file here.
    for f in [path / n for n in SAVED_JSON] + [d / n for d in sorted(path.iterdir()) if d.is_dir() for n in SAVED_JSON]:
        if not f.exists():
            continue
        kind = special_file(f)
        if kind:
            raise UserError(f"{not_saved}: {f}: {kind}, not a regular file (it is not read)")
        try:
            doc = json.loads(f.read_bytes())
        except (OSError, ValueError) as exc:  # JSON and UTF-8 errors are ValueErrors
            raise UserError(f"{not_saved}: {f}: {first_line(exc)}") from None
        if not isinstance(doc, dict):
            raise UserError(f"{not_saved}: {f}: not a JSON object")
    try:
        ds = datasets.load_from_disk(str(path))
    except Exception as exc:  # a missing or damaged data file, fields of another datasets version
        raise UserError(f"{not_saved}: {type(exc).__name__}: {first_line(exc)}") from None
    if isinstance(ds, datasets.DatasetDict):
        if split not in ds:
            raise UserError(f"{field}: {path}: no split {split!r} (has {', '.join(ds)})")
        ds = ds[split]
    return ds


def _load_hub(path: str, split: str, field: str):
    import datasets

    try:
        return datasets.load_dataset(path, split=split)
    except Exception as exc:
        raise UserError(f"{field}: {path}: not a local path, and the hub dataset could not be loaded "
                        f"(offline? set HF_HOME to a cache that has it): {exc}") from None


def load_raw(path: str, split: str, base: Path, field: str, fmt: str, text_field: str,
             fields: dict[str, str] | None = None):
    """(dataset, format, locate): every row checked against the format (detected when `auto`), the
    file's columns renamed to the format's field names first (`fields`: format's -> file's)."""
    columns = {col: name for name, col in (fields or {}).items()}
    local = resolve_local(path, base)
    locate: Locate | None = None
    if local is not None and local.is_dir() and any((local / f).exists() for f in ("dataset_dict.json", "state.json")):
        ds, where = _load_saved(local, split, field), str(local)
    elif local is not None:
        files = _files_of(local, field)
        if all(f.suffix.lower() == ".jsonl" for f in files):
            fmt, locate = scan_jsonl(files, fmt, text_field, field, columns)  # before pyarrow sees the rows
        ds = _read(SUFFIX_BUILDER[files[0].suffix.lower()], files, field)
        where = str(files[0]) if len(files) == 1 else str(local)
    elif looks_like_hub_id(path):
        ds, where = _load_hub(path, split, field), path
    else:
        raise UserError(f"{field}: {path}: no such file or folder")
    ds = images.undecoded(ds)  # image features left undecoded: checked as JSONL's images are
    if len(ds) == 0:
        raise UserError(f"{field}: {path}: the dataset is empty")
    if columns:
        missing_columns(ds.column_names, columns, field, where)
        ds = ds.remove_columns([n for n in columns.values() if n in ds.column_names and n not in columns])
        ds = ds.rename_columns(columns)
    if fmt == "auto":
        fmt = detect_format(ds.column_names, text_field, where)
    if locate is None:  # not JSONL: every row checked here, named by its index

        def locate(i: int) -> str:
            return f"{where} row {i + 1}"

        check_rows(iter(ds), fmt, text_field, locate, field)
    if fmt == "messages" and images.COLUMN in ds.column_names:  # image rows: every image opened here
        folder = local if local is not None and local.is_dir() else local.parent if local is not None else Path.cwd()
        ds, bad = images.resolve(ds, folder, locate)
        refuse(bad[:NAMED], len(bad), len(ds), field)
        fmt = images.FORMAT
    return ds, fmt, locate


def _alpaca(row: dict[str, Any]) -> dict[str, str]:
    inp = (row.get("input") or "").strip()
    return {
        "prompt": ALPACA_PROMPT.format(
            instruction=row["instruction"], input_block=f"### Input:\n{inp}\n\n" if inp else ""
        ),
        "completion": str(row["output"]),
    }


def shape(ds, fmt: str, text_field: str, path: str):
    """Map rows (already checked against `fmt`) to what SFTTrainer expects: `text`,
    `prompt`+`completion`, or `messages`. Row order is kept, so a row's index still locates it."""
    cols = list(ds.column_names)
    if fmt == "prompt":  # the sampling trainers: TRL passes every other column to the reward functions as keyword arguments
        taken = [c for c in cols if c in pref_rows.REWARD_ARGS]
        if taken:
            raise UserError(f"data: {path}: column(s) {taken} have the names of arguments TRL gives the reward "
                            "functions itself; rename them")
        return ds
    if fmt in pref_rows.FORMATS:  # TRL's own column names; anything else is left out
        return ds.select_columns([c for c in pref_rows.COLUMNS[fmt] if c in cols])
    if fmt == "text":
        if text_field not in cols:
            raise UserError(f"data.text_field: {path}: no column {text_field!r} (has {cols})")
        ds = ds.select_columns([text_field])
        return ds.rename_column(text_field, "text") if text_field != "text" else ds
    if fmt == "alpaca":
        missing = [c for c in ("instruction", "output") if c not in cols]
        if missing:
            raise UserError(f"data.format: alpaca: {path}: missing column(s) {missing} (has {cols})")
        return ds.map(_alpaca, remove_columns=cols)
    if fmt == images.FORMAT:
        return ds.select_columns(["messages", images.COLUMN])
    key = "messages" if "messages" in cols else "conversations" if "conversations" in cols else None
    if key is None:
        raise UserError(f"data.format: messages: {path}: no 'messages' column (has {cols})")
    ds = ds.select_columns([key])
    return ds.rename_column(key, "messages") if key != "messages" else ds


# check(dataset, format, locate, field): more checks on a shaped dataset (the tokenizer's, in
# preflight.py), run before the eval split so a row's index still locates it.
Check = Callable[[Any, str, Locate, str], None]


def data_format(cfg, have: str | None = None, field: str = "data.format") -> str:
    """The format the objective reads: SFT's are detected (`auto`) or named; each preference
    objective reads one of TRL's types, which `data.format` (or a source's) may name but not contradict."""
    formats = registry.data_formats()
    want = formats.get(cfg.objective)
    have = cfg.data.format if have is None else have
    if want is None and have in pref_rows.FORMATS:
        raise UserError(f"{field}: {have} is data for "
                        f"{'/'.join(k for k, v in formats.items() if v == have)}, not objective "
                        f"{registry.named(lambda u: not u.data_format)}")
    if want is not None and have not in ("auto", want):
        raise UserError(f"{field}: objective {cfg.objective} trains on {want} rows "
                        f"({pref_rows.HINT[want]}), not {have}")
    return want or have


def load_datasets(cfg, base: Path, check: Check | None = None):
    """(train, eval or None, format) for the config's `data` section, every row checked."""
    if cfg.data.sources:
        return load_mixture(cfg, base, check)
    d = cfg.data
    train, fmt, where = load_raw(d.path, d.split, base, "data.path", data_format(cfg), d.text_field, d.fields)
    return prepare(cfg, d, "data", base, (train, fmt, where), check)


def prepare(cfg, src, field: str, base: Path, raw, check: Check | None = None, shaper=None):
    """(train, eval or None, format) of one source (`src`: data, or one of data.sources, named `field`)
    loaded by load_raw (`raw`): shaped (by `shaper(dataset, format)` -> (dataset, format) where given),
    checked, and its eval rows loaded (eval_path) or held out (eval_split) under the seed."""
    train, fmt, where = raw
    shaper = shaper or (lambda ds, f: (shape(ds, f, src.text_field, src.path), f))
    train, fmt = shaper(train, fmt)
    if check:
        check(train, fmt, where, f"{field}.path")
    evald = None
    if src.eval_path:
        evald, efmt, where = load_raw(src.eval_path, src.split, base, f"{field}.eval_path", raw[1], src.text_field,
                                      src.fields)
        evald, _ = shaper(evald, efmt)
        if check:
            check(evald, fmt, where, f"{field}.eval_path")
    elif src.eval_split > 0:
        held = math.ceil(src.eval_split * len(train))  # what train_test_split holds out
        if len(train) - held < 1:
            raise UserError(f"{field}.eval_split: {src.eval_split} of {len(train)} rows holds out {held}, leaving no "
                            f"training rows; lower it or give {field}.eval_path")
        parts = train.train_test_split(test_size=src.eval_split, seed=cfg.train.seed)
        train, evald = parts["train"], parts["test"]
    return train, evald, fmt


# --- mixtures ---
# Dataset mixtures (`data.sources`): several sources, each with its own format, field names and eval
# split, every row checked as a single `data.path` is, then mixed with `datasets` under the seed.
#
# Without weights the sources are concatenated (every row once); with weights
# `datasets.interleave_datasets` draws each row's source with probability weight / sum(weights),
# seeded by train.seed, so the same config and files give the same mixture in every run (a
# `--resume` included). TRL shuffles the mixed rows again under the same seed (data.shuffle).

# Formats TRL trains on side by side once they share one form: alpaca rows become a user turn and an
# assistant turn (as LLaMA-Factory reads alpaca data), so a chat source and an alpaca source mix.
CHAT = "messages"


def _alpaca_chat(row: dict[str, Any]) -> dict[str, Any]:
    inp = (row.get("input") or "").strip()
    user = f"{row['instruction']}\n\n{inp}" if inp else row["instruction"]
    return {CHAT: [{"role": "user", "content": user}, {"role": "assistant", "content": str(row["output"])}]}


def _as_parts(row: dict[str, Any]) -> dict[str, Any]:
    parts = [{**m, "content": [{"type": "text", "text": m["content"]}]} for m in row["messages"]]
    return {"messages": parts, images.COLUMN: []}


def _shaper(src, target: str):
    """shape(), or for an alpaca source in a chat mixture its rows as conversations."""

    def shaper(ds, fmt):
        if fmt == "alpaca" and target in (CHAT, images.FORMAT):
            ds, fmt = ds.map(_alpaca_chat, remove_columns=ds.column_names), CHAT
        if fmt == CHAT and target == images.FORMAT:  # text conversations beside image rows (_cast gives their form)
            return shape(ds, fmt, src.text_field, src.path), target
        return shape(ds, fmt, src.text_field, src.path), fmt

    return shaper


def _target(fmts: list[str]) -> str:
    """The one format the mixture trains as, or a refusal naming the source that cannot join it."""
    kinds = set(fmts)
    if len(kinds) == 1:
        return fmts[0]
    if kinds == {CHAT, "alpaca"}:
        return CHAT
    if images.FORMAT in kinds and kinds <= {images.FORMAT, CHAT, "alpaca"}:
        return images.FORMAT  # image rows and conversations: the text ones as image rows without images
    first = fmts[0]
    i = next(i for i, f in enumerate(fmts) if f != first)
    raise UserError(f"data.sources.{i}.format: {fmts[i]} rows do not mix with the {first} rows of data.sources.0 "
                    "(sources mix when they share a format, or are chat (messages), image (vision) and alpaca rows)")


def _cast(parts: list[tuple[int, Any]], ref) -> list:
    """Every (source index, dataset) cast to `ref`'s features (the same columns and types), or a refusal."""
    out = []
    for i, ds in parts:
        if ds.features != ref.features:
            try:
                # text conversations beside image rows: their turns as text parts, no images
                ds = ds.map(_as_parts, features=ref.features) if images.COLUMN not in ds.column_names \
                    and images.COLUMN in ref.column_names else ds.cast(ref.features)
            except Exception as exc:  # columns or types that cannot be cast (datasets/pyarrow errors)
                raise UserError(f"data.sources.{i}: its rows' columns {dict(ds.features)} differ from "
                                f"data.sources.0's {dict(ref.features)} ({first_line(exc)[:200]})") from None
        out.append(ds)
    return out


def load_mixture(cfg, base: Path, check: Check | None = None):
    """(train, eval or None, format) for data.sources: each source loaded and checked on its own, its
    eval rows held out, then the training rows mixed (weights) or concatenated; eval rows concatenated."""
    import datasets

    d = cfg.data
    raws = []
    for i, src in enumerate(d.sources):
        field = f"data.sources.{i}"
        fmt = data_format(cfg, src.format, f"{field}.format")
        raws.append(load_raw(src.path, src.split, base, f"{field}.path", fmt, src.text_field, src.fields))
    target = _target([r[1] for r in raws])
    trains, evals = [], []
    for i, (src, raw) in enumerate(zip(d.sources, raws)):
        train, evald, _ = prepare(cfg, src, f"data.sources.{i}", base, raw, check, _shaper(src, target))
        trains.append((i, train))
        if evald is not None:
            evals.append((i, evald))
    ref = trains[0][1]
    trains = _cast(trains, ref)
    if d.sources[0].weight is None:
        train = datasets.concatenate_datasets(trains)
    else:
        total = sum(s.weight for s in d.sources)
        # Each source shuffled first: a source the mixture stops short of gives a seeded sample of its rows,
        # not its first ones.
        trains = [t.shuffle(seed=cfg.train.seed) for t in trains]
        train = datasets.interleave_datasets(trains, probabilities=[s.weight / total for s in d.sources],
                                             seed=cfg.train.seed, stopping_strategy=d.stopping_strategy)
    evald = datasets.concatenate_datasets(_cast(evals, ref)) if evals else None
    return train, evald, target
