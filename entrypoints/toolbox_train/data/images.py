"""Image rows (vision-language SFT): `messages` whose content holds image parts ({"type": "image"}) and
an `images` column of local paths (relative to the data file) or embedded bytes; every row's images
counted against its markers, every image opened and decoded before anything is written.

A row's images are kept in the dataset as strings: an absolute path, or the embedded bytes as
`base64:<data>`; training/vision.py opens them batch by batch.
"""

from __future__ import annotations

import base64
import binascii
import io
import re
import warnings
from pathlib import Path
from typing import Any, Callable, Iterable

from toolbox_train.contract import UserError, first_line
from toolbox_train.guards import special_file

FORMAT = "vision"  # the data format of image rows (data/dataset.py keeps `messages` and `images`)
COLUMN = "images"
EMBEDDED = "base64:"
# Pillow's own decompression-bomb limit (PIL.Image.MAX_IMAGE_PIXELS, 89,478,485 pixels), checked from the
# header before any pixel is decoded: Pillow itself only warns below twice that.
MAX_PIXELS = 89_478_485
REMOTE = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*://")


def image_parts(content: Any) -> int:
    """How many image parts a message's content holds (a string holds none)."""
    return sum(1 for p in content if isinstance(p, dict) and p.get("type") == "image") if isinstance(content, list) else 0


def parts_problem(key: str, i: int, role: str, content: list) -> str | None:
    """What is wrong with a message's list of parts ({"type": "image"} or {"type": "text", "text": ...})."""
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind == "text" and isinstance(part.get("text"), str):
            continue
        if kind == "image":
            if role == "assistant":
                return f"{key}[{i}].content[{j}]: an image in an assistant turn (images go in user or system turns)"
            extra = sorted(k for k, v in part.items() if k != "type" and v is not None)  # Parquet: None fields
            if extra:  # TRL's form: the image itself is in the row's `images`, in order
                return (f"{key}[{i}].content[{j}]: an image part is {{\"type\": \"image\"}}, its image in the row's "
                        f"'images' list (got keys {extra})")
            continue
        return f"{key}[{i}].content[{j}] must be {{\"type\": \"text\", \"text\": string}} or {{\"type\": \"image\"}}"
    return None


def _entry_problem(entry: Any) -> str | None:
    if isinstance(entry, str):
        return "a remote URL (download the image; local paths or embedded bytes only)" if REMOTE.match(entry) else None
    if isinstance(entry, dict):
        if entry.get("bytes") is not None:
            return None if isinstance(entry["bytes"], (str, bytes)) else "'bytes' must be base64 text"
        if isinstance(entry.get("path"), str):
            return _entry_problem(entry["path"])
    return "an image is a local path or {\"bytes\": base64}"


def count_problem(messages: list, images: Any) -> str | None:
    """The row's image parts against its `images` list (as many, in order)."""
    marks = sum(image_parts(m.get("content")) for m in messages if isinstance(m, dict))
    if images is None:
        images = []
    if not isinstance(images, list):
        return f"'images' must be a list, got {type(images).__name__}"
    if marks != len(images):
        return (f"{len(images)} image(s) in 'images' for {marks} image part(s) in the messages "
                "(one image per {\"type\": \"image\"} part)")
    for j, entry in enumerate(images):
        why = _entry_problem(entry)
        if why:
            return f"images[{j}]: {why}"
    return None


def _source(entry: Any, base: Path) -> tuple[str, Path | bytes]:
    """(the string the dataset keeps, the file or bytes to open)."""
    if isinstance(entry, dict) and entry.get("bytes") is not None:
        raw = entry["bytes"]
        if isinstance(raw, str):
            try:
                raw = base64.b64decode(raw, validate=True)
            except (binascii.Error, ValueError):
                raise ValueError("'bytes' is not base64") from None
        return EMBEDDED + base64.b64encode(raw).decode(), raw
    path = Path(entry["path"] if isinstance(entry, dict) else entry).expanduser()
    path = path if path.is_absolute() else base / path
    return str(path.resolve()), path


def open_problem(src: Path | bytes, max_pixels: int = MAX_PIXELS) -> str | None:
    """Why the image cannot be used (missing, not a regular file, not an image, too many pixels, truncated)."""
    from PIL import Image, UnidentifiedImageError

    if isinstance(src, Path):
        if not src.exists():
            return f"{src}: no such file"
        kind = special_file(src) or ("a folder" if src.is_dir() else None)
        if kind:
            return f"{src}: {kind}, not a regular file (it is not read)"
    name = src if isinstance(src, Path) else "embedded image"
    try:
        with warnings.catch_warnings():  # Pillow warns of a bomb that is refused here anyway
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            im = Image.open(src if isinstance(src, Path) else io.BytesIO(src))
        with im:
            w, h = im.size
            if w * h > max_pixels:  # before decoding: a bomb's header is small, its pixels are not
                return f"{name}: {w}x{h} = {w * h:,} pixels, above the limit of {max_pixels:,} (decompression bomb?)"
            im.load()
    except UnidentifiedImageError:
        return f"{name}: not an image Pillow can read"
    except Image.DecompressionBombError as exc:
        return f"{name}: {first_line(exc)}"
    except (OSError, SyntaxError, ValueError) as exc:  # truncated or damaged data, unreadable file
        return f"{name}: cannot be decoded ({first_line(exc)[:160]})"
    return None


def undecoded(ds):
    """A dataset whose `images` are `datasets` Image features (Parquet or save_to_disk written by `datasets`)
    with them left as {bytes, path}: checked and kept as the JSONL forms are, never decoded to PIL here."""
    import datasets

    feat = ds.features.get(COLUMN) if COLUMN in ds.column_names else None
    if isinstance(getattr(feat, "feature", None), datasets.Image):
        return ds.cast_column(COLUMN, datasets.List(datasets.Image(decode=False)))
    return ds


def resolve(ds, base: Path, locate: Callable[[int], str]):
    """(dataset, bad rows): every row's images opened (paths relative to `base`, the data file's folder) and
    kept as strings (absolute path or base64:...); `bad`: (where, why) of each bad row, for rowcheck.refuse."""
    bad: list[tuple[str, str]] = []
    out: list[list[str]] = []
    for i, row in enumerate(_rows(ds)):
        why = count_problem(row["messages"], row[COLUMN])
        kept: list[str] = []
        for j, entry in enumerate([] if why else row[COLUMN] or []):
            try:
                keep, src = _source(entry, base)
            except ValueError as exc:
                why = f"images[{j}]: {exc}"
                break
            problem = open_problem(src)
            if problem:
                why = f"images[{j}]: {problem}"
                break
            kept.append(keep)
        if why:
            bad.append((locate(i), why))
        out.append(kept)
    return ds.remove_columns([COLUMN]).add_column(COLUMN, out), bad


def _rows(ds) -> Iterable[dict]:
    for batch in ds.iter(batch_size=256):
        yield from ({"messages": m, COLUMN: im} for m, im in zip(batch["messages"], batch[COLUMN]))


def load_image(src: str):
    """A kept image (resolve's string) as an RGB PIL image."""
    from PIL import Image

    data = io.BytesIO(base64.b64decode(src[len(EMBEDDED):])) if src.startswith(EMBEDDED) else src
    with Image.open(data) as im:
        return im.convert("RGB")


def image_size(src: str) -> tuple[int, int]:
    """A kept image's (width, height), from its header (nothing decoded)."""
    from PIL import Image

    data = io.BytesIO(base64.b64decode(src[len(EMBEDDED):])) if src.startswith(EMBEDDED) else src
    with Image.open(data) as im:
        return im.size


def refuse_text_model(model_path: str, field: str) -> None:
    raise UserError(f"{field}: image rows (an 'images' column) need a vision-language model; {model_path} has no "
                    "vision_config (a text-only model): use an image-text-to-text checkpoint, or text rows")
