"""output.report_to: MLflow, W&B (offline) and Trackio each hold the run's loss series, read back from
their local stores with the trackers' own readers; a missing tracker package or a secret in the
config is one line, exit 2, nothing written."""

from __future__ import annotations

import importlib.util
import json
import struct
import subprocess
import sys
import types

import pytest
import yaml

from helpers.tiny import train_config, write_dataset
from toolbox_train.contract import UserError
from toolbox_train.commands import finetune
from toolbox_train.config import tracking

ENV = ("MLFLOW_TRACKING_URI", "MLFLOW_EXPERIMENT_NAME", "WANDB_MODE", "WANDB_PROJECT", "WANDB_DIR",
       "WANDB_ENTITY", "TRACKIO_DIR", "TENSORBOARD_LOGGING_DIR")


@pytest.fixture
def clean_env(monkeypatch):
    """The trackers' variables unset, and put back after the test (the run sets them in-process)."""
    for k in ENV:
        monkeypatch.setenv(k, "x")
        monkeypatch.delenv(k)


def _loss_series(out):
    rows = [json.loads(ln) for ln in (out / "metrics.jsonl").read_text().splitlines()]
    return [(r["step"], r["loss"]) for r in rows]


def _wandb_records(path):
    """The records of a .wandb file: wandb 0.31 ships no Python reader, so the LevelDB-log framing
    (a 7-byte file header, 32 KiB blocks, 7-byte chunk headers) is undone here and each record parsed
    with wandb's own protobuf definition."""
    from wandb.proto import wandb_internal_pb2

    data, pos, buf = path.read_bytes(), 7, b""
    assert data[:4] == b":W&B"
    while pos + 7 <= len(data):
        left = 32768 - pos % 32768
        if left < 7:  # too little room for a chunk header: the block's tail is padding
            pos += left
            continue
        _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        if kind == 0:
            break
        chunk, pos = data[pos + 7:pos + 7 + length], pos + 7 + length
        buf = chunk if kind in (1, 2) else buf + chunk
        if kind in (1, 4):  # FULL or LAST: a whole record
            rec = wandb_internal_pb2.Record()
            rec.ParseFromString(buf)
            yield rec


def test_mlflow_wandb_trackio_hold_the_loss_of_metrics_jsonl(tmp_path, tiny_model, clean_env, monkeypatch):
    # Secrets in the environment, where the trackers read them: none may reach a file of the run.
    secrets = {"WANDB_API_KEY": "sekret-wandb-0123456789012345678901234567890123",
               "MLFLOW_TRACKING_TOKEN": "sekret-mlflow-token", "HF_TOKEN": "hf_sekretHFtoken"}
    for k, v in secrets.items():
        monkeypatch.setenv(k, v)
    data = write_dataset(tmp_path / "d.jsonl", "text", n=24)
    out = tmp_path / "out"
    cfg = tmp_path / "train.yaml"
    cfg.write_text(yaml.safe_dump(train_config(tiny_model, data, out, **{
        "train.max_steps": 4, "output.report_to": ["mlflow", "wandb", "trackio"], "output.run_name": "tiny-run",
        "output.mlflow": {"experiment": "exp-a"}, "output.wandb": {"project": "proj-w"},
        "output.trackio": {"project": "proj-t"}})))
    # the finetune command, as a user runs it: a process of its own (trackio reads TRACKIO_DIR once, at its
    # first import, so an earlier in-process run of the suite must not decide where this one logs)
    subprocess.run([sys.executable, "-m", "toolbox_train.commands.finetune", "--config", str(cfg)], check=True,
                   capture_output=True, env={**__import__("os").environ})
    want = _loss_series(out)
    assert [s for s, _ in want] == [1, 2, 3, 4]

    # MLflow: the sqlite store in the output folder, through mlflow's client
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{out / 'mlflow.db'}")
    (run,) = client.search_runs([client.get_experiment_by_name("exp-a").experiment_id])
    assert run.info.run_name == "tiny-run" and run.info.status == "FINISHED"
    got = sorted((m.step, m.value) for m in client.get_metric_history(run.info.run_id, "loss"))
    assert got == want

    # W&B: the offline run under <output.dir>/wandb, nothing sent
    (run_dir,) = (out / "wandb").glob("offline-run-*")
    (wandb_file,) = run_dir.glob("run-*.wandb")
    got, names = [], []
    for rec in _wandb_records(wandb_file):
        if rec.WhichOneof("record_type") == "run":
            names.append((rec.run.project, rec.run.display_name))
        if rec.WhichOneof("record_type") == "history":
            items = {(i.key or "/".join(i.nested_key)): json.loads(i.value_json) for i in rec.history.item}
            if "train/loss" in items:
                got.append((items["train/global_step"], items["train/loss"]))
    assert names and names[0] == ("proj-w", "tiny-run")
    assert got == want

    # Trackio: its local database under <output.dir>/trackio, through trackio's storage API (in a fresh
    # interpreter: trackio reads TRACKIO_DIR once, at import)
    code = ("import json, sys; from trackio.sqlite_storage import SQLiteStorage as S; "
            "print(json.dumps([[r.get('train/global_step'), r.get('train/loss')] for r in S.get_logs('proj-t', 'tiny-run')]))")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**__import__("os").environ, "TRACKIO_DIR": str(out / "trackio")})
    logs = json.loads(res.stdout.strip().splitlines()[-1])
    got = [(s, v) for s, v in logs if v is not None]
    assert got == want
    assert (out / "trackio" / "proj-t.db").is_file()
    leaked = [f for f in out.rglob("*") if f.is_file() and any(v.encode() in f.read_bytes() for v in secrets.values())]
    assert not leaked


@pytest.mark.parametrize("name", ["mlflow", "wandb", "trackio"])
def test_missing_tracker_package_is_one_line_before_anything_is_written(tmp_path, capsys, monkeypatch,
                                                                        tiny_model, name):
    # The packages are installed here (the test extra); their absence is what find_spec reports.
    real = importlib.util.find_spec
    monkeypatch.setattr(tracking.importlib.util, "find_spec", lambda m, *a: None if m == name else real(m, *a))
    data = write_dataset(tmp_path / "d.jsonl")
    cfg = tmp_path / "t.yaml"
    cfg.write_text(yaml.safe_dump(train_config(tiny_model, data, tmp_path / "out",
                                               **{"output.report_to": ["tensorboard", name]})))
    assert finetune.main(["--config", str(cfg)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err
    assert f"output.report_to: {name} needs the {name} package" in err
    assert f"pip install '{tracking.TRACKERS[name][2]}' (on a host: the strix-toolbox[{name}] extra)" in err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("over, message", [
    ({"output.mlflow": {"tracking_uri": "https://alice:s3cret@mlflow.example/"}},
     "output.mlflow.tracking_uri: credentials in the URI would land in config.resolved.yaml"),
    ({"output.report_to": ["mlflow"], "output.wandb": {"project": "p"}},
     "output.wandb: set, but wandb is not in output.report_to"),
    ({"output.report_to": ["neptune"]}, "output.report_to.0: Input should be"),
    ({"output.report_to": ["mlflow"], "output.mlflow": {"tracking_uri": "file:///srv/mlruns"}},
     "output.mlflow.tracking_uri: file:///srv/mlruns: MLflow's folder store is in maintenance mode"),
    ({"output.wandb": {"api_key": "k"}, "output.report_to": ["wandb"]}, "output.wandb.api_key: unknown key"),
])
def test_bad_tracking_settings_refused(tmp_path, capsys, tiny_model, over, message):
    data = write_dataset(tmp_path / "d.jsonl")
    cfg = tmp_path / "t.yaml"
    cfg.write_text(yaml.safe_dump(train_config(tiny_model, data, tmp_path / "out", **over)))
    assert finetune.main(["--config", str(cfg)]) == 2
    err = capsys.readouterr().err
    assert message in err and "s3cret" not in err
    assert not (tmp_path / "out").exists()


def test_config_wins_over_the_environment_which_wins_over_the_output_folder(tmp_path, monkeypatch, clean_env):
    import os

    from toolbox_train.config.schema import load_config

    def args(**output):
        cfg, _ = load_config({"model": {"path": "m"}, "data": {"path": "d.jsonl"},
                              "output": {"dir": str(tmp_path / "run"), **output}})
        return tracking.training_args(cfg.output, tmp_path / "run", tmp_path)

    monkeypatch.delitem(sys.modules, "trackio.utils", raising=False)  # not loaded yet, as in a fresh process
    a = args(report_to=["mlflow", "wandb", "trackio"])
    assert a["report_to"] == ["mlflow", "wandb", "trackio"] and a["run_name"] == "run" and a["project"] == "toolbox"
    assert os.environ["MLFLOW_TRACKING_URI"] == f"sqlite:///{tmp_path / 'run' / 'mlflow.db'}"
    assert os.environ["WANDB_MODE"] == "offline" and os.environ["WANDB_DIR"] == str(tmp_path / "run")
    assert os.environ["TRACKIO_DIR"] == str(tmp_path / "run" / "trackio")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://mlflow.internal:5000")
    monkeypatch.setenv("WANDB_MODE", "online")
    args(report_to=["mlflow", "wandb"])
    assert os.environ["MLFLOW_TRACKING_URI"] == "http://mlflow.internal:5000" and os.environ["WANDB_MODE"] == "online"
    args(report_to=["mlflow", "wandb"], mlflow={"tracking_uri": "file:///srv/mlruns"}, wandb={"mode": "disabled"})
    assert os.environ["MLFLOW_TRACKING_URI"] == "file:///srv/mlruns" and os.environ["WANDB_MODE"] == "disabled"
    assert args(tensorboard=True)["report_to"] == ["tensorboard"] and args()["report_to"] == "none"
    # trackio already loaded in this process with another run's folder: refused, not logged there
    monkeypatch.setitem(sys.modules, "trackio.utils", types.SimpleNamespace(TRACKIO_DIR=tmp_path / "first"))
    with pytest.raises(UserError, match=r"output.trackio: trackio is already loaded in this process with its database "
                                        r"in .*first; run this finetune in a process of its own"):
        args(report_to=["trackio"])
    monkeypatch.setitem(sys.modules, "trackio.utils", types.SimpleNamespace(TRACKIO_DIR=tmp_path / "run" / "trackio"))
    assert args(report_to=["trackio"])["report_to"] == ["trackio"]


def test_a_folder_store_from_the_environment_is_named(tmp_path, capsys, monkeypatch, tiny_model, clean_env):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "./mlruns")
    data = write_dataset(tmp_path / "d.jsonl")
    cfg = tmp_path / "t.yaml"
    cfg.write_text(yaml.safe_dump(train_config(tiny_model, data, tmp_path / "out", **{"output.report_to": ["mlflow"]})))
    assert finetune.main(["--config", str(cfg)]) == 2
    assert "MLFLOW_TRACKING_URI (environment): ./mlruns: MLflow's folder store" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow's own opt-out: accepted then
    assert finetune.main(["--config", str(cfg), "--plan"]) == 0


def _one_masked_line(err: str) -> str:
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert "s3cret" not in err, err
    return err


def test_a_password_in_a_set_uri_is_masked_in_the_error(tmp_path, capsys, tiny_model, clean_env):
    # the YAML form never repeated the value; the --set form named its item, password and all
    data = write_dataset(tmp_path / "d.jsonl")
    cfg = tmp_path / "t.yaml"
    cfg.write_text(yaml.safe_dump(train_config(tiny_model, data, tmp_path / "out")))
    assert finetune.main(["--config", str(cfg), "--set", "output.mlflow.tracking_uri=https://alice:s3cret@mlflow.example/"]) == 2
    err = _one_masked_line(capsys.readouterr().err)
    assert "credentials in the URI would land in config.resolved.yaml" in err
    assert "--set output.mlflow.tracking_uri=https://alice:***@mlflow.example/" in err
    assert not (tmp_path / "out").exists()


def _closed_port() -> int:
    """A port of 127.0.0.1 nothing listens on (bound, then closed): a tracking server that is down."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_tracking_server_that_is_down_is_refused_before_anything_loads(tmp_path, capsys, monkeypatch, tiny_model,
                                                                         clean_env):
    port = _closed_port()
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"http://alice:s3cret@127.0.0.1:{port}/")
    data = write_dataset(tmp_path / "d.jsonl")
    cfg = tmp_path / "t.yaml"
    cfg.write_text(yaml.safe_dump(train_config(tiny_model, data, tmp_path / "out", **{"output.report_to": ["mlflow"]})))
    assert finetune.main(["--config", str(cfg)]) == 2
    err = _one_masked_line(capsys.readouterr().err)
    assert (f"MLFLOW_TRACKING_URI (environment): http://alice:***@127.0.0.1:{port}/: cannot reach the MLflow server "
            f"127.0.0.1:{port} (Connection refused)") in err
    assert not (tmp_path / "out").exists()  # no config.resolved.yaml, no model loaded


def test_a_tracking_server_that_listens_passes_the_check():
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        tracking._check_mlflow_store(f"http://127.0.0.1:{s.getsockname()[1]}/")
    with pytest.raises(UserError, match="cannot reach the MLflow server"):
        tracking._check_mlflow_store(f"http://127.0.0.1:{_closed_port()}/")
