"""Bad image rows: one line naming the row (file:line) and what is wrong, exit 2, before the model loads,
nothing written; and the good forms (embedded bytes, a second image file) accepted."""

from __future__ import annotations

import base64
import json

import pytest

from helpers.tiny import write_train_config
from helpers.tiny_vision import image_rows, png_bytes, write_image_dataset
from toolbox_train.commands import finetune
from toolbox_train.data.images import MAX_PIXELS


def _write(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _refused(tmp_path, capsys, model, data, expect, **over):
    cfg = write_train_config(tmp_path / "t.yaml", model, data, tmp_path / "out", **over)
    assert finetune.main(["--config", str(cfg)]) == 2
    err = capsys.readouterr().err
    assert expect in err, err
    assert "Traceback" not in err and err.count("error:") == 1, err
    assert not (tmp_path / "out").exists()  # nothing written
    return err


@pytest.fixture
def rows(tmp_path):
    data = write_image_dataset(tmp_path / "train.jsonl", n=3)
    return tmp_path, [json.loads(ln) for ln in data.read_text().splitlines()]


def _bad_image(tmp_path, content: bytes):
    (tmp_path / "images" / "bad.png").write_bytes(content)
    return "images/bad.png"


@pytest.mark.parametrize("case, expect", [
    ("missing", "images/nope.png: no such file"),
    ("not-image", "bad.png: not an image Pillow can read"),
    ("truncated", "bad.png: cannot be decoded"),
    ("folder", "images: a folder, not a regular file"),
    ("remote", "images[0]: a remote URL"),
    ("not-base64", "images[0]: 'bytes' is not base64"),
])
def test_bad_image_named_by_row(rows, tiny_vlms, capsys, case, expect):
    tmp_path, rs = rows
    entry = {"missing": "images/nope.png", "not-image": lambda: _bad_image(tmp_path, b"hello, not a png"),
             "truncated": lambda: _bad_image(tmp_path, png_bytes("red", 64)[:60]), "folder": "images",
             "remote": "https://example.com/cat.png", "not-base64": {"bytes": "@@not base64@@"}}[case]
    rs[1]["images"] = [entry() if callable(entry) else entry]
    data = _write(tmp_path / "train.jsonl", rs)
    err = _refused(tmp_path, capsys, tiny_vlms("gemma3"), data, expect)
    assert f"{data}:2: " in err


def test_decompression_bomb_refused_before_decoding(rows, tiny_vlms, capsys):
    from PIL import Image

    tmp_path, rs = rows
    side = int(MAX_PIXELS ** 0.5) + 10  # a 1-bit image over the pixel limit: a small file, a huge decode
    Image.new("1", (side, side)).save(tmp_path / "images" / "bomb.png")
    rs[0]["images"] = ["images/bomb.png"]
    data = _write(tmp_path / "train.jsonl", rs)
    _refused(tmp_path, capsys, tiny_vlms("gemma3"), data, f"{data}:1: images[0]: ")
    _refused(tmp_path, capsys, tiny_vlms("gemma3"), data, f"above the limit of {MAX_PIXELS:,} (decompression bomb?)")


@pytest.mark.parametrize("more", [True, False])
def test_images_and_markers_must_match(rows, tiny_vlms, capsys, more):
    tmp_path, rs = rows
    if more:
        rs[2]["images"] = rs[2]["images"] * 2
        expect = f":3: 2 image(s) in 'images' for 1 image part(s)"
    else:
        rs[2]["images"] = []
        expect = f":3: 0 image(s) in 'images' for 1 image part(s)"
    _refused(tmp_path, capsys, tiny_vlms("gemma3"), _write(tmp_path / "train.jsonl", rs), expect)


def test_image_in_an_assistant_turn(rows, tiny_vlms, capsys):
    tmp_path, rs = rows
    rs[0]["messages"][1]["content"].append({"type": "image"})
    rs[0]["images"].append(rs[0]["images"][0])
    _refused(tmp_path, capsys, tiny_vlms("gemma3"), _write(tmp_path / "train.jsonl", rs),
             ":1: messages[1].content[1]: an image in an assistant turn")


def test_image_rows_for_a_text_model(rows, tiny_model, capsys):
    tmp_path, rs = rows
    _refused(tmp_path, capsys, tiny_model, _write(tmp_path / "train.jsonl", rs),
             "image rows (an 'images' column) need a vision-language model")


def test_packing_refused(rows, tiny_vlms, capsys):
    tmp_path, rs = rows
    _refused(tmp_path, capsys, tiny_vlms("gemma3"), _write(tmp_path / "train.jsonl", rs),
             "data.packing: image rows are not packed", **{"data.packing": True})


def test_embedded_and_relative_images_train(tmp_path, tiny_vlms):
    """Images embedded as base64 and paths relative to the data file (not the working folder) both load."""
    rs = image_rows(2, embed=True) + image_rows(2, tmp_path / "d" / "images")
    for r in rs[2:]:
        r["images"] = [{"bytes": base64.b64encode((tmp_path / "d" / r["images"][0]).read_bytes()).decode()}]
    data = _write(tmp_path / "d" / "train.jsonl", rs)
    cfg = write_train_config(tmp_path / "t.yaml", tiny_vlms("gemma3"), data, tmp_path / "out",
                             **{"train.max_steps": 1, "data.max_seq_length": 128})
    assert finetune.main(["--config", str(cfg)]) == 0
    rel = write_image_dataset(tmp_path / "e" / "train.jsonl", n=2)
    cfg = write_train_config(tmp_path / "t2.yaml", tiny_vlms("gemma3"), rel, tmp_path / "out2",
                             **{"train.max_steps": 1, "data.max_seq_length": 128})
    assert finetune.main(["--config", str(cfg)]) == 0


@pytest.mark.parametrize("form", ["parquet", "saved"])
def test_image_features_of_datasets(tmp_path, tiny_vlms, form, capsys):
    """Rows written by `datasets` with its Image feature (Parquet, save_to_disk): the images come as bytes,
    checked as JSONL's are (a bad one named by its row), and train."""
    import datasets
    from PIL import Image

    rs = image_rows(4, tmp_path / "src" / "images")
    feats = datasets.Features({"messages": datasets.List({"role": datasets.Value("string"), "content": datasets.List(
        {"type": datasets.Value("string"), "text": datasets.Value("string")})}), "images": datasets.List(datasets.Image())})
    for r in rs:
        r["images"] = [Image.open(tmp_path / "src" / p) for p in r["images"]]
    ds = datasets.Dataset.from_list(rs, features=feats)
    data = tmp_path / ("train.parquet" if form == "parquet" else "saved")
    ds.to_parquet(str(data)) if form == "parquet" else ds.save_to_disk(str(data))
    cfg = write_train_config(tmp_path / "t.yaml", tiny_vlms("gemma3"), data, tmp_path / "out",
                             **{"train.max_steps": 1, "data.max_seq_length": 128})
    assert finetune.main(["--config", str(cfg)]) == 0
    bad = ds.cast_column("images", datasets.List(datasets.Image(decode=False))).map(
        lambda r, i: {"images": [{"bytes": b"not a png", "path": None}] if i == 2 else r["images"]}, with_indices=True)
    data2 = tmp_path / ("bad.parquet" if form == "parquet" else "bad")
    bad.to_parquet(str(data2)) if form == "parquet" else bad.save_to_disk(str(data2))
    cfg = write_train_config(tmp_path / "t2.yaml", tiny_vlms("gemma3"), data2, tmp_path / "out2")
    assert finetune.main(["--config", str(cfg)]) == 2
    assert "row 3: images[0]: embedded image: not an image Pillow can read" in capsys.readouterr().err


def test_a_pixel_budget_the_processor_cannot_honour(rows, tiny_vlms, capsys):
    tmp_path, rs = rows
    data = _write(tmp_path / "train.jsonl", rs)
    # the image processor's class by its backend: Gemma3ImageProcessor where torchvision imports, else ...Pil
    err = _refused(tmp_path, capsys, tiny_vlms("gemma3"), data, "takes no pixel budget (it resizes every image to "
                   "28x28", **{"vision.max_pixels": 50176})
    assert "vision.max_pixels: Gemma3ImageProcessor" in err, err
    _refused(tmp_path, capsys, tiny_vlms("gemma3"), data, "vision.max_pixels: 100 is below vision.min_pixels (200)",
             **{"vision.max_pixels": 100, "vision.min_pixels": 200})


def test_plan_counts_tokens_under_the_budget(tmp_path, capsys):
    from helpers.tiny import train_config
    from helpers.tiny_vision import make_tiny_vlm

    model_dir = make_tiny_vlm(tmp_path / "q", "qwen2.5-vl")
    data = write_image_dataset(tmp_path / "d" / "train.jsonl", n=2)
    cfg = tmp_path / "t.yaml"
    import yaml

    cfg.write_text(yaml.safe_dump(train_config(model_dir, data, tmp_path / "out",
                                               **{"vision.min_pixels": 3136, "vision.max_pixels": 802816})))
    assert finetune.main(["--config", str(cfg), "--plan"]) == 0
    assert "4-1024 tokens per image by its resolution (min_pixels 3,136, max_pixels 802,816" in capsys.readouterr().out


def test_lora_on_the_projector_alone(rows, tiny_vlms, capsys):
    tmp_path, rs = rows
    _refused(tmp_path, capsys, tiny_vlms("gemma3"), _write(tmp_path / "train.jsonl", rs),
             "vision.train: LoRA adapts the language model or the vision tower; [projector] alone",
             **{"method": "lora", "vision.train": ["projector"]})


def test_a_template_that_renders_no_image_markers(rows, tiny_vlms, capsys):
    """A chat template without image parts (a text model's) renders no marker: the processor would take the image
    for no place in the text (Qwen's accepts two images for one marker; the model fails later)."""
    import shutil

    tmp_path, rs = rows
    model = tmp_path / "vlm"
    shutil.copytree(tiny_vlms("gemma3"), model)
    (model / "chat_template.jinja").write_text("{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}<|end|>\n"
                                               "{% endfor %}")
    _refused(tmp_path, capsys, model, _write(tmp_path / "train.jsonl", rs),
             ":1: the chat template renders 0 image marker(s) for the row's 1 image(s)")


def test_the_budget_reaches_a_qwen_processor(tiny_vlms):
    """vision.min_pixels / max_pixels as training loads the processor (training/loading.py): an image becomes the
    tokens --plan counts for the budget (the tiny processor's own range: 28x28, one token)."""
    import io

    from PIL import Image
    from transformers import AutoConfig

    from toolbox_train.models.vision import load_processor, tokens_per_image

    model = tiny_vlms("qwen2.5-vl")
    image = Image.open(io.BytesIO(png_bytes("red", size=100)))
    for want, tokens in [({}, 1), ({"min_pixels": 3136, "max_pixels": 3136}, 4), ({"max_pixels": 12544}, 16)]:
        proc = load_processor(str(model), **want)
        ids = proc(text=["<|vision_start|><|image_pad|><|vision_end|>"], images=[image])["input_ids"][0]
        assert ids.count(proc.image_token_id) == tokens
        if want:
            plan = tokens_per_image(AutoConfig.from_pretrained(model), str(model), want)
            assert plan.split(" tokens per image")[0].endswith(f"-{tokens}")


@pytest.mark.parametrize("family", ["gemma3", "qwen2.5-vl"])
def test_max_seq_length_cutting_image_tokens_refused_before_loading(rows, tiny_vlms, capsys, family):
    """A row whose image tokens data.max_seq_length would cut (the model fails on such a batch) is named before
    the model loads; a row whose text alone is cut after its image trains (that cut is TRL's, as for text).
    Qwen's images give tokens by their size: a large image in row 2 only."""
    from PIL import Image

    tmp_path, rs = rows
    model = tiny_vlms(family)
    Image.new("RGB", (28 * 6, 28 * 6), (200, 10, 10)).save(tmp_path / "images" / "big.png")
    if family == "qwen2.5-vl":  # the tiny processor's 28x28 budget raised so the big image gives 36 tokens
        over = {"vision.max_pixels": 28 * 28 * 36, "vision.min_pixels": 28 * 28}
        rs[1]["images"] = ["images/big.png"]
    else:
        over = {}
    data = _write(tmp_path / "train.jsonl", rs)
    from transformers import AutoProcessor

    proc = AutoProcessor.from_pretrained(model, **({"max_pixels": 28 * 28 * 36, "min_pixels": 28 * 28}
                                                   if over else {}))
    from toolbox_train.data.images import load_image
    from toolbox_train.models.vision import image_token_ids

    def last_image_token(r):
        text = proc.apply_chat_template(r["messages"], tokenize=False)
        ids = proc(text=[text], images=[[load_image(str(tmp_path / p)) for p in r["images"]]],
                   add_special_tokens=False)["input_ids"][0]
        return max(j for j, t in enumerate(ids) if t in image_token_ids(proc)) + 1

    ends = [last_image_token(r) for r in rs]
    cut = max(ends) - 1  # cuts into the row with the latest image tokens, not into the others
    err = _refused(tmp_path, capsys, model, data, f"data.max_seq_length {cut} cuts into the row's image tokens",
                   **{"data.max_seq_length": cut, **over})
    worst = ends.index(max(ends)) + 1
    assert f"{data}:{worst}: " in err and f"its last image token at {max(ends)}" in err, err
    if family == "qwen2.5-vl":
        assert worst == 2 and max(ends) > sorted(ends)[-2]
    # just past the last image the rows' answers are cut whole: nothing to learn (a NaN loss), named too
    err = _refused(tmp_path, capsys, model, data, f"data.max_seq_length {max(ends)} leaves none of the row's answer",
                   **{"data.max_seq_length": max(ends), **over})
    assert f"{data}:{worst}: " in err
    # with every answer's first tokens inside, the rows pass the check and train (the cut is TRL's, as for text)
    cfg = write_train_config(tmp_path / "ok.yaml", model, data, tmp_path / "out", **{
        "data.max_seq_length": max(ends) + 64, "train.max_steps": 1, **over})
    assert finetune.main(["--config", str(cfg)]) == 0, capsys.readouterr().err
