"""Fuzzing finetune's input checks (issue 13): mutated train configs and generated JSONL datasets.

Properties, for every input: finetune exits 2 with one message that names the file (the config,
the dataset, or the model folder), or its checks all pass; never exit 1, never a traceback; an
existing output folder stays byte-identical after a refusal, and nothing is written before the
checks have passed.

Examples call finetune.main() in-process. Training would take seconds an example, so the run
stops where the checks end: `prepare_output` (the first thing that writes) is replaced by one
that raises `ChecksPassed`, a BaseException the CLI's handler does not catch. Examples are
derandomized so CI runs the same set; TOOLBOX_FUZZ=random explores new ones
(TOOLBOX_FUZZ_TRAIN_EXAMPLES=N sets how many).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import string
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from helpers.tiny import train_config, write_dataset
from toolbox_train.commands import finetune

EXAMPLES = int(os.environ.get("TOOLBOX_FUZZ_TRAIN_EXAMPLES", "40"))
FUZZ = settings(max_examples=EXAMPLES, deadline=None, database=None,
                derandomize=os.environ.get("TOOLBOX_FUZZ") != "random",
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                       HealthCheck.function_scoped_fixture])


class ChecksPassed(BaseException):
    pass


@pytest.fixture(scope="module")
def world(tmp_path_factory, tiny_models):
    d = tmp_path_factory.mktemp("fuzz-train")
    out = d / "out"
    out.mkdir()
    (out / "notes.txt").write_text("an earlier run's output\n")  # must survive every refusal
    return {"dir": d, "model": tiny_models("llama"), "out": out,
            "data": write_dataset(d / "good.jsonl", "text", n=12)}


@pytest.fixture(autouse=True)
def _stop_before_writing(monkeypatch):
    def stop(*a, **kw):
        raise ChecksPassed

    monkeypatch.setattr(finetune, "prepare_output", stop)


def _snapshot(d: Path) -> dict[str, bytes]:
    return {str(p.relative_to(d)): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()}


def check(argv: list[str], world: dict, names: list[str]) -> int:
    before_out, before_dir = _snapshot(world["out"]), sorted(p.name for p in world["dir"].iterdir())
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            code = finetune.main(argv)
        except ChecksPassed:
            code = 0
        except SystemExit as exc:  # argparse's own usage errors
            code = exc.code
    err = err.getvalue()
    assert code in (0, 2), (code, err)
    assert "Traceback" not in err, err
    if code == 2:
        msg = err[err.index("finetune: error: "):]
        assert any(n in msg for n in names), err
    assert _snapshot(world["out"]) == before_out
    assert sorted(p.name for p in world["dir"].iterdir()) == before_dir
    return code


# ---------------------------------------------------------------- train configs

KEYS = ["model.path", "model.revision", "data.path", "data.format", "data.max_seq_length", "data.text_field",
        "data.eval_split", "data.packing", "method", "backend", "train.learning_rate", "train.batch_size",
        "train.per_device_batch_size", "train.max_steps", "train.epochs", "train.precision", "train.optimizer",
        "train.lr_scheduler", "train.liger", "train.gradient_checkpointing", "lora.r", "lora.target_modules",
        "output.dir", "output.save_steps", "output.keep_checkpoints", "output.tensorboard", "colour", "train.lr"]
VALUES = st.one_of(st.none(), st.booleans(), st.integers(-3, 5000), st.floats(allow_nan=True),
                   st.text(max_size=12), st.lists(st.integers(0, 3), max_size=3),
                   st.dictionaries(st.text(string.ascii_lowercase, max_size=4), st.integers(), max_size=2),
                   st.sampled_from(["auto", "hf", "lora", "qlora", "full", "bf16", "fp32", "cosine", "adamw_torch",
                                    "nope", "/no/such/model", "../../etc", "org/model", "text", "messages"]))
BYTES = st.binary(min_size=1, max_size=16)
# Values that pass the schema but not the checks after it (plan, data, model files), per key.
PLAUSIBLE = {
    "model.path": ["/no/such/model", "org/absent-model", ".", "good.jsonl"], "model.revision": ["main", "v9"],
    "data.path": ["/no/such.jsonl", "org/absent-dataset", "fuzz.yaml", ".", "x.parquet"],
    "data.format": ["alpaca", "messages", "text", "auto"], "data.max_seq_length": [1, 4, 8, 100000],
    "data.text_field": ["body", "text"], "data.eval_split": [0.5, 0.99], "data.packing": [True],
    "method": ["qlora", "lora-8bit", "lora", "full"], "backend": ["unsloth", "auto", "hf"],
    "train.batch_size": [3, 5, 6, 16], "train.per_device_batch_size": [3, 7], "train.precision": ["bf16", "fp16"],
    "train.optimizer": ["nope", "adamw_torch", "sgd"], "train.lr_scheduler": ["cosine", "nope"],
    "train.liger": [True], "output.tensorboard": [True], "lora.target_modules": [["nope_proj"], "all-linear"],
    "output.dir": ["good.jsonl", "/proc/nope"], "train.gradient_checkpointing": [True, "unsloth"],
}


@st.composite
def configs(draw):
    edit = st.sampled_from(KEYS).flatmap(lambda k: st.tuples(st.just(k), st.sampled_from(PLAUSIBLE.get(k, [None]))
                                                              | VALUES))
    edits = draw(st.lists(edit, max_size=3))
    drop = draw(st.lists(st.sampled_from(["model", "data", "data.path", "model.path", "train", "output"]), max_size=1))
    text_edit = draw(st.sampled_from(["none", "none", "truncate", "bytes", "tab", "alias", "tag"]))
    return edits, drop, text_edit, draw(BYTES), draw(st.integers(0, 400))


@FUZZ
@given(case=configs())
def test_fuzz_train_configs(world, case):
    edits, drop, text_edit, junk, cut = case
    cfg = train_config(world["model"], world["data"], world["out"], **dict(edits))
    if cfg["data"]["path"] in ("good.jsonl", "fuzz.yaml"):  # relative: beside the config
        cfg["data"]["path"] = str(world["dir"] / cfg["data"]["path"])
    for key in drop:
        node, *rest = key.split(".")
        (cfg.pop(node, None) if not rest else cfg.get(node, {}).pop(rest[0], None))
    text = yaml.safe_dump(cfg, sort_keys=False).encode()
    if text_edit == "truncate":
        text = text[:cut]
    elif text_edit == "bytes":
        text = text[:cut] + junk + text[cut:]
    elif text_edit == "tab":
        text = text.replace(b"  ", b"\t", 1)
    elif text_edit == "alias":
        text += b"a: &x [1, 2]\nb: [*x, *x, *x]\n"
    elif text_edit == "tag":
        text += b"extra: !!python/object/apply:os.system [true]\n"
    path = world["dir"] / "fuzz.yaml"
    path.write_bytes(text)
    try:
        # An unchanged output folder is "not empty": --overwrite lets the other checks speak (it
        # empties the folder only once they have all passed, and prepare_output never runs here).
        check(["--config", str(path), "--overwrite"], world,
              [str(path), str(world["model"]), str(world["data"]), str(world["out"])])
    finally:
        path.unlink()


# ---------------------------------------------------------------- JSONL datasets

GOOD = {"text": {"text": "the cat sees the moon."},
        "alpaca": {"instruction": "Repeat.", "input": "a dog", "output": "a dog"},
        "messages": {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}}
JSON_VALUES = st.recursive(st.one_of(st.none(), st.booleans(), st.integers(), st.text(max_size=8)),
                           lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner,
                                                                                      max_size=3), max_leaves=6)


@st.composite
def lines(draw, fmt: str):
    row = json.loads(json.dumps(GOOD[fmt]))
    kind = draw(st.sampled_from(["good", "good", "good", "drop", "retype", "extra", "json", "blank", "bytes",
                                 "broken", "role"]))
    if kind == "drop":
        row.pop(draw(st.sampled_from(sorted(row))))
    elif kind == "retype":
        row[draw(st.sampled_from(sorted(row)))] = draw(JSON_VALUES)
    elif kind == "extra":
        row[draw(st.text(max_size=6))] = draw(JSON_VALUES)
    elif kind == "json":
        return json.dumps(draw(JSON_VALUES)).encode()
    elif kind == "blank":
        return draw(st.sampled_from([b"", b"   ", b"\t"]))
    elif kind == "bytes":
        return draw(BYTES).replace(b"\n", b"")
    elif kind == "broken":
        return json.dumps(row).encode()[: draw(st.integers(1, 20))]
    elif kind == "role" and fmt == "messages":
        row["messages"][0]["role"] = draw(st.sampled_from(["robot", "", "USER", "tool"]))
    return json.dumps(row).encode()


@st.composite
def datasets(draw):
    fmt = draw(st.sampled_from(sorted(GOOD)))
    body = draw(st.lists(lines(fmt), max_size=12))
    return fmt, draw(st.sampled_from(["auto", fmt])), b"\n".join(body) + draw(st.sampled_from([b"", b"\n"]))


@FUZZ
@given(case=datasets(), max_len=st.sampled_from([8, 64]))
def test_fuzz_jsonl_datasets(world, case, max_len):
    fmt, declared, body = case
    data = world["dir"] / "fuzz.jsonl"
    data.write_bytes(body)
    cfg = world["dir"] / "fuzz.yaml"
    cfg.write_text(yaml.safe_dump(train_config(world["model"], data, world["out"], **{
        "data.format": declared, "data.max_seq_length": max_len})))
    try:
        check(["--config", str(cfg), "--overwrite"], world, [str(data)])
    finally:
        data.unlink()
        cfg.unlink()
