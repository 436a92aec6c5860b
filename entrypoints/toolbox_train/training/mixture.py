"""Dataset mixtures (`data.sources`): several sources, each with its own format, field names and eval
split, every row checked as a single `data.path` is, then mixed with `datasets` under the seed.

Without weights the sources are concatenated (every row once); with weights
`datasets.interleave_datasets` draws each row's source with probability weight / sum(weights),
seeded by train.seed, so the same config and files give the same mixture in every run (a
`--resume` included). TRL shuffles the mixed rows again under the same seed (data.shuffle).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..cli import UserError, first_line
from .data import Check, data_format, load_raw, prepare, shape

# Formats TRL trains on side by side once they share one form: alpaca rows become a user turn and an
# assistant turn (as LLaMA-Factory reads alpaca data), so a chat source and an alpaca source mix.
CHAT = "messages"


def _alpaca_chat(row: dict[str, Any]) -> dict[str, Any]:
    inp = (row.get("input") or "").strip()
    user = f"{row['instruction']}\n\n{inp}" if inp else row["instruction"]
    return {CHAT: [{"role": "user", "content": user}, {"role": "assistant", "content": str(row["output"])}]}


def _shaper(src, target: str):
    """shape(), or for an alpaca source in a chat mixture its rows as conversations."""

    def shaper(ds, fmt):
        if fmt == "alpaca" and target == CHAT:
            return ds.map(_alpaca_chat, remove_columns=ds.column_names), CHAT
        return shape(ds, fmt, src.text_field, src.path), fmt

    return shaper


def _target(fmts: list[str]) -> str:
    """The one format the mixture trains as, or a refusal naming the source that cannot join it."""
    kinds = set(fmts)
    if len(kinds) == 1:
        return fmts[0]
    if kinds == {CHAT, "alpaca"}:
        return CHAT
    first = fmts[0]
    i = next(i for i, f in enumerate(fmts) if f != first)
    raise UserError(f"data.sources.{i}.format: {fmts[i]} rows do not mix with the {first} rows of data.sources.0 "
                    "(sources mix when they share a format, or are chat (messages) and alpaca rows)")


def _cast(parts: list[tuple[int, Any]], ref) -> list:
    """Every (source index, dataset) cast to `ref`'s features (the same columns and types), or a refusal."""
    out = []
    for i, ds in parts:
        if ds.features != ref.features:
            try:
                ds = ds.cast(ref.features)
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
