"""Config schema, overrides, data loading in every format, and the shipped accelerate configs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from helpers.tiny import train_config, write_dataset
from toolbox_train.config.schema import load_config
from toolbox_train.data.dataset import load_datasets
from toolbox_train.contract import UserError

ROOT = Path(__file__).resolve().parents[2]


def _cfg(tmp_path, data, **over):
    c, base = load_config(train_config(tmp_path / "m", data, tmp_path / "out", **over))
    return c, base


def test_unknown_keys_are_named_with_their_path(tmp_path):
    raw = train_config("m", "d.jsonl", "out", **{"train.learnig_rate": 1, "lora.rank": 4, "colour": "red"})
    p = tmp_path / "train.yaml"
    p.write_text(yaml.safe_dump(raw))
    with pytest.raises(UserError) as e:
        load_config(p)
    msg = str(e.value)
    line = p.read_text().splitlines().index("  learnig_rate: 1") + 1
    assert f"{p}:{line}: train.learnig_rate: unknown key" in msg  # the line the key is written on
    assert "lora.rank: unknown key" in msg and "colour: unknown key" in msg


def test_set_overrides_are_typed_and_validated(tmp_path):
    c, _ = load_config(train_config("m", "d", "o"), ["train.learning_rate=1e-4", "data.packing=true",
                                                     "lora.target_modules=[q_proj, v_proj]"])
    assert c.train.learning_rate == 1e-4 and c.data.packing is True
    assert c.lora.target_modules == ["q_proj", "v_proj"]
    with pytest.raises(UserError, match="train.per_device_batch_size"):
        load_config(train_config("m", "d", "o"), ["train.per_device_batch_size=0"])
    with pytest.raises(UserError, match="expected key.path=value"):
        load_config(train_config("m", "d", "o"), ["train.seed"])
    with pytest.raises(UserError, match="method"):
        load_config(train_config("m", "d", "o"), ["method=dora"])


@pytest.mark.parametrize("fmt,suffix", [("text", ".jsonl"), ("text", ".parquet"), ("text", ".csv"),
                                        ("alpaca", ".jsonl"), ("alpaca", ".csv"), ("messages", ".jsonl"),
                                        ("messages", ".parquet")])
def test_each_format_and_file_type_loads(tmp_path, fmt, suffix):
    data = write_dataset(tmp_path / f"d{suffix}", fmt, n=20)
    c, base = _cfg(tmp_path, data, **{"data.eval_split": 0.25})
    train, evald, got = load_datasets(c, base)
    assert got == fmt
    assert len(train) == 15 and len(evald) == 5
    row = train[0]
    if fmt == "text":
        assert set(train.column_names) == {"text"} and row["text"].endswith(".")
    elif fmt == "alpaca":
        assert set(train.column_names) == {"prompt", "completion"}
        assert "### Instruction:" in row["prompt"] and row["prompt"].endswith("### Response:\n")
        assert row["completion"] in row["prompt"]  # the task is "repeat the input"
    else:
        assert [m["role"] for m in row["messages"]] == ["user", "assistant"]


def test_saved_datasets_folder_and_relative_paths(tmp_path):
    import datasets

    rows = [{"text": f"the cat sees {i}."} for i in range(10)]
    datasets.DatasetDict({"train": datasets.Dataset.from_list(rows)}).save_to_disk(tmp_path / "saved")
    cfgfile = tmp_path / "train.yaml"
    cfgfile.write_text(yaml.safe_dump(train_config("m", "saved", "out")))  # relative to the config file
    c, base = load_config(cfgfile)
    train, evald, fmt = load_datasets(c, base)
    assert (len(train), evald, fmt) == (10, None, "text")
    c2, base2 = load_config(cfgfile, ["data.split=validation"])
    with pytest.raises(UserError, match="no split 'validation'"):
        load_datasets(c2, base2)


def test_malformed_jsonl_names_file_and_line(tmp_path):
    p = write_dataset(tmp_path / "d.jsonl", "text", n=5)
    lines = p.read_text().splitlines()
    lines[3] = '{"text": "broken'
    p.write_text("\n".join(lines) + "\n")
    c, base = _cfg(tmp_path, p)
    with pytest.raises(UserError, match=rf"{p}:4: malformed JSON line"):
        load_datasets(c, base)


def test_missing_dataset_and_unknown_columns(tmp_path):
    c, base = _cfg(tmp_path, tmp_path / "nope.jsonl")
    with pytest.raises(UserError, match="data.path: .*nope.jsonl: no such file"):
        load_datasets(c, base)
    p = tmp_path / "odd.jsonl"
    p.write_text(json.dumps({"question": "a", "answer": "b"}) + "\n")
    c, base = _cfg(tmp_path, p)
    with pytest.raises(UserError, match="cannot tell the format"):
        load_datasets(c, base)
    c, base = _cfg(tmp_path, "someone/some-dataset")  # a hub id: offline, not cached
    with pytest.raises(UserError, match="hub dataset could not be loaded"):
        load_datasets(c, base)


@pytest.mark.parametrize("name", ["ddp.yaml", "fsdp.yaml", "ddp-cpu.yaml"])
def test_shipped_accelerate_configs_parse_with_accelerate(name):
    from accelerate.commands.config.config_args import ClusterConfig

    path = ROOT / "entrypoints" / "accelerate" / name
    cfg = ClusterConfig.from_yaml_file(str(path))
    if name == "fsdp.yaml":
        f = cfg.fsdp_config
        assert cfg.distributed_type.value == "FSDP"
        assert f["fsdp_version"] == 2 and f["fsdp_auto_wrap_policy"] == "TRANSFORMER_BASED_WRAP"
        assert f["fsdp_state_dict_type"] == "SHARDED_STATE_DICT"
        assert f["fsdp_reshard_after_forward"] and f["fsdp_cpu_ram_efficient_loading"]
        assert f["fsdp_activation_checkpointing"]
    else:
        assert cfg.distributed_type.value == "MULTI_GPU" and not cfg.use_cpu
    # The package sees the same files (symlinked in, shipped as package data).
    assert (ROOT / "entrypoints" / "toolbox_train" / "accelerate" / name).read_text() == path.read_text()
