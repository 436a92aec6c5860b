"""Experiment trackers (`output.report_to`): transformers' own callbacks for TensorBoard, MLflow, W&B and
Trackio, their stores in the output folder unless the config says otherwise.

Secrets never pass through here: the trackers read WANDB_API_KEY, MLFLOW_TRACKING_TOKEN,
MLFLOW_TRACKING_USERNAME/PASSWORD or HF_TOKEN from the environment themselves, and no config field
holds one (a tracking URI with a password in it is refused), so config.resolved.yaml and argv carry none.
"""

from __future__ import annotations

import importlib.util
import os
import socket
import sys
from pathlib import Path
from typing import Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, field_validator

from toolbox_train.contract import UserError

# report_to name -> (the module transformers' callback imports, the pip extra that installs it, its pin)
TRACKERS = {
    "tensorboard": ("tensorboard", None, "tensorboard"),
    "mlflow": ("mlflow", "mlflow", "mlflow==3.17.2"),
    "wandb": ("wandb", "wandb", "wandb==0.31.0"),
    "trackio": ("trackio", "trackio", "trackio==0.43.0"),
}
# What the trackers write into the output folder by default, at the start of training (before step 1).
STORES = ("tensorboard", "mlflow.db", "wandb", "trackio")
Tracker = Literal["tensorboard", "mlflow", "wandb", "trackio"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True, frozen=True)


class MlflowCfg(_Strict):
    tracking_uri: str | None = Field(
        None, description="sqlite:///path.db or a server (http[s]://); unset: MLFLOW_TRACKING_URI if the "
        "environment sets it, else sqlite:///<output.dir>/mlflow.db")
    experiment: str = Field("toolbox", min_length=1)

    @field_validator("tracking_uri")
    @classmethod
    def _no_credentials(cls, v: str | None) -> str | None:
        if v and (urlsplit(v).username or urlsplit(v).password):
            raise ValueError("credentials in the URI would land in config.resolved.yaml; set "
                             "MLFLOW_TRACKING_USERNAME/MLFLOW_TRACKING_PASSWORD or MLFLOW_TRACKING_TOKEN "
                             "in the environment instead")
        return v


class WandbCfg(_Strict):
    project: str = Field("toolbox", min_length=1)
    entity: str | None = None
    mode: Literal["offline", "online", "disabled"] | None = Field(
        None, description="unset: WANDB_MODE if the environment sets it, else offline (nothing leaves the "
        "machine; `wandb sync` uploads the run later)")
    dir: str | None = Field(None, description="where wandb/ goes; unset: output.dir")


class TrackioCfg(_Strict):
    project: str = Field("toolbox", min_length=1)
    dir: str | None = Field(None, description="the local database's folder; unset: <output.dir>/trackio")


def trackers(o) -> list[str]:
    """What transformers reports to: output.report_to, and output.tensorboard's older switch."""
    names = list(dict.fromkeys(o.report_to))
    if o.tensorboard and "tensorboard" not in names:
        names.insert(0, "tensorboard")
    return names


def check(o) -> None:
    """Refuse, before anything is written, a tracker whose package is missing and settings for a
    tracker that is not asked for (a typo in report_to would otherwise log nowhere, silently)."""
    names = trackers(o)
    for name in ("mlflow", "wandb", "trackio"):
        # set to something but its defaults: config.resolved.yaml writes every section out, so a
        # resolved config read back (resume's checks, --plan on it) has them all "set"
        if name not in names and getattr(o, name) != type(getattr(o, name))():
            raise UserError(f"output.{name}: set, but {name} is not in output.report_to (add it there to log to it)")
    if "mlflow" in names:
        _check_mlflow_store(o.mlflow.tracking_uri)
    for name in names:
        module, extra, pin = TRACKERS[name]
        if name == "tensorboard":
            if not (importlib.util.find_spec("tensorboard") or importlib.util.find_spec("tensorboardX")):
                field = "output.report_to" if "tensorboard" in o.report_to else "output.tensorboard"
                raise UserError(f"{field}: tensorboard needs the tensorboard package (pip install tensorboard)")
        elif importlib.util.find_spec(module) is None:
            raise UserError(f"output.report_to: {name} needs the {module} package, which is not installed here: "
                            f"pip install '{pin}' (on a host: the strix-toolbox[{extra}] extra)")


def _check_mlflow_store(uri: str | None) -> None:
    # MLflow 3.17 refuses its folder store (maintenance mode) unless MLFLOW_ALLOW_FILE_STORE=true, and
    # would say so only when training starts, after the model loaded: said here, before anything.
    field = "output.mlflow.tracking_uri" if uri else "MLFLOW_TRACKING_URI (environment)"
    uri = uri or os.environ.get("MLFLOW_TRACKING_URI")
    if not uri or os.environ.get("MLFLOW_ALLOW_FILE_STORE", "").lower() in ("true", "1"):
        return
    scheme = urlsplit(uri).scheme
    if scheme == "file" or not scheme or len(scheme) == 1:  # a path (C:\... on Windows)
        raise UserError(f"{field}: {uri}: MLflow's folder store is in maintenance mode and refused by mlflow "
                        "3.17; use a sqlite file (sqlite:///PATH/mlflow.db), or set MLFLOW_ALLOW_FILE_STORE=true")
    if scheme in ("http", "https"):
        _check_reachable(field, uri)


REACH_TIMEOUT_S = 5


def _check_reachable(field: str, uri: str) -> None:
    """A tracking server that is down would fail the run only after the model loaded and the run
    folder was written: a TCP connect to it now, before anything (the guard masks the URI's password)."""
    parts = urlsplit(uri)
    try:
        host, port = parts.hostname, parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError as exc:  # a port that is not a number
        raise UserError(f"{field}: {uri}: {exc}") from None
    if not host:
        raise UserError(f"{field}: {uri}: no host in the URI")
    try:
        socket.create_connection((host, port), timeout=REACH_TIMEOUT_S).close()
    except OSError as exc:
        why = exc.strerror or type(exc).__name__  # socket.timeout has no strerror
        raise UserError(f"{field}: {uri}: cannot reach the MLflow server {host}:{port} ({why}); start it, or "
                        "point the URI at one that runs") from None


def _local(d: str | None, base: Path, default: Path) -> str:
    return str(default if d is None else (base / d).resolve())


def training_args(o, out: Path, base: Path) -> dict:
    """TrainingArguments' report_to/run_name/project, after pointing each tracker's environment
    variables (what transformers' callbacks read) at its store. Explicit config values win over the
    environment; the environment wins over the defaults in the output folder."""
    names = trackers(o)
    env = os.environ
    if "tensorboard" in names:
        env.setdefault("TENSORBOARD_LOGGING_DIR", str(out / "tensorboard"))
    if "mlflow" in names:
        m = o.mlflow
        if m.tracking_uri:
            env["MLFLOW_TRACKING_URI"] = m.tracking_uri
        else:
            env.setdefault("MLFLOW_TRACKING_URI", f"sqlite:///{out / 'mlflow.db'}")
        env["MLFLOW_EXPERIMENT_NAME"] = m.experiment
    if "wandb" in names:
        w = o.wandb
        env["WANDB_PROJECT"] = w.project
        if w.entity:
            env["WANDB_ENTITY"] = w.entity
        if w.mode:
            env["WANDB_MODE"] = w.mode
        else:
            env.setdefault("WANDB_MODE", "offline")
        env["WANDB_DIR"] = _local(w.dir, base, out)
        Path(env["WANDB_DIR"]).mkdir(parents=True, exist_ok=True)  # wandb falls back to a temp dir otherwise
    if "trackio" in names:
        # trackio reads TRACKIO_DIR when it is first imported (transformers' callback imports it later)
        env["TRACKIO_DIR"] = _local(o.trackio.dir, base, out / "trackio")
        loaded = getattr(sys.modules.get("trackio.utils"), "TRACKIO_DIR", None)
        if loaded is not None and Path(loaded) != Path(env["TRACKIO_DIR"]):
            # a second run in one Python process (finetune.run called twice): trackio would log into the
            # first run's database, not this one's
            raise UserError(f"output.trackio: trackio is already loaded in this process with its database in "
                            f"{loaded}; run this finetune in a process of its own to log to {env['TRACKIO_DIR']}")
    return dict(report_to=names or "none", run_name=o.run_name or out.name,
                **({"project": o.trackio.project} if "trackio" in names else {}))


def finish(failed: bool = False) -> None:
    """Close the W&B run: transformers' callback leaves it open until the interpreter exits, so a
    run called in-process (finetune.run) would return with its offline files unflushed. MLflow's and
    Trackio's callbacks end their runs at train end themselves."""
    wandb = sys.modules.get("wandb")
    if wandb is not None and getattr(wandb, "run", None) is not None:
        wandb.finish(exit_code=1 if failed else 0)
