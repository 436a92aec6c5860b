"""The proof of issue 4, for real: the cpu stack built with `toolbox build`, a tiny model
trained in it by `toolbox run` with 2 DDP ranks (gloo), through podman and through the
Docker SDK against podman's API socket, and a rebuild after an HF pin change that takes
the base and torch layers from cache."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from helpers.enginekit import ca_bundle, podman, toolbox, wheelhouse

pytestmark = pytest.mark.slow


def workspace(tmp_path: Path, tiny_model: Path, **overrides) -> Path:
    """A host folder mounted at /workspace: model, data, train.yaml with container paths."""
    from helpers.tiny import write_dataset, write_train_config

    ws = tmp_path / "ws"
    shutil.copytree(tiny_model, ws / "model")
    write_dataset(ws / "data" / "train.jsonl", "text", n=64)
    cfg = {"method": "lora", "train.max_steps": 8, "train.learning_rate": 1e-2, **overrides}
    write_train_config(ws / "train.yaml", "/workspace/model", "/workspace/data/train.jsonl", "/workspace/out", **cfg)
    return ws


def assert_trained(ws: Path, tiny_model: Path, method: str = "lora") -> None:
    out = ws / "out"
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]
    assert len(rows) >= 4, rows
    losses = [r["loss"] for r in rows]
    assert losses[-1] < losses[0], f"loss did not go down: {losses}"
    summary = json.loads((out / "summary.json").read_text())
    # every rank contributed its weights' digest, and DDP kept them equal
    digests = summary["rank_weight_sha256"]
    assert len(digests) == 2 and digests[0] == digests[1], digests
    settings = json.loads(next(out.rglob("settings.node0.json")).read_text())
    assert settings["world_size"] == 2 and settings["device"].startswith("cpu")
    # outputs belong to the caller, not to some container uid
    assert (out / "metrics.jsonl").stat().st_uid == Path(ws).stat().st_uid
    if method == "lora":
        assert (out / "adapter_model.safetensors").is_file() and (out / "adapter_config.json").is_file()
        from peft import PeftModel
        from transformers import AutoModelForCausalLM

        base = AutoModelForCausalLM.from_pretrained(tiny_model)
        model = PeftModel.from_pretrained(base, out)
        assert any("lora_" in n for n, _ in model.named_parameters())
    else:
        assert (out / "model.safetensors").is_file()
        from transformers import AutoModelForCausalLM

        AutoModelForCausalLM.from_pretrained(out)


def train_argv() -> list[str]:
    return ["--", "launch", "--strategy", "ddp", "--nproc", "2", "--cpu", "--",
            "finetune", "--config", "/workspace/train.yaml"]


def test_podman_build_then_ddp_training_in_the_image(cpu_image, tiny_model, tmp_path):
    out = cpu_image["stdout"]
    tag = cpu_image["tag"]
    from toolbox.stack.load import load_stack

    stack = load_stack("cpu")
    assert tag == f"localhost/toolbox-cpu:{stack.digest()}"
    for field in ("image:", "id:", "size:", "pins:"):
        assert re.search(rf"^{field}", out, re.M), f"build summary lacks {field}"
    assert "torch.version = 2.13.0+cpu" in out
    # the CA bundle was a build secret: not in the history, the config, or /run/secrets
    bundle = str(ca_bundle())
    assert bundle not in podman("history", "--no-trunc", "--format", "{{.CreatedBy}}", tag).stdout
    assert bundle not in podman("image", "inspect", tag).stdout
    assert "SHELL is not supported" not in out  # docker format keeps the Dockerfile's pipefail
    ls = podman("run", "--rm", tag, "sh", "-c", "ls -A /run/secrets 2>/dev/null | wc -l").stdout.strip()
    assert ls == "0"

    ws = workspace(tmp_path, tiny_model)
    cp = toolbox("run", "--stack", "cpu", "--engine", "podman", "--workspace", str(ws),
                 "--hf-cache", str(tmp_path / "hf"), *train_argv(), timeout=900)
    assert cp.returncode == 0, cp.stdout[-5000:] + cp.stderr[-5000:]
    assert_trained(ws, tiny_model)

    # the in-container doctor: CPU torch, no collectives lib, pins of the lock all installed
    cp = toolbox("doctor", "--stack", "cpu", "--engine", "podman", "--in-image")
    assert cp.returncode == 0, cp.stdout + cp.stderr
    assert "label pins: all" in cp.stdout and "pin transformers.version: transformers 5.17.0" in cp.stdout
    # the same image judged against a stack whose HF pin moved: labels disagree, exit 1, a fix
    cp = toolbox("doctor", "--stack", "cpu", "--set", "hf.peft=0.21.1", "--image", tag, "--engine", "podman")
    assert cp.returncode == 1, cp.stdout + cp.stderr
    assert "peft.version: image '0.21.2' != stack '0.21.1'" in cp.stdout and "fix: rebuild" in cp.stdout


def test_docker_sdk_build_and_run_via_podman_socket(cpu_image, podman_socket, tiny_model, tmp_path):
    env = {"DOCKER_HOST": podman_socket}
    tag = "localhost/toolbox-cpu:docker-sdk"
    podman("rmi", "-f", tag, check=False)
    cp = toolbox("build", "--stack", "cpu", "--engine", "docker", "--tag", tag,
                 "--ca-bundle", str(ca_bundle()), "--wheelhouse", str(wheelhouse()), env=env, timeout=1800)
    assert cp.returncode == 0, cp.stdout[-5000:] + cp.stderr[-5000:]
    assert f"image:  {tag}" in cp.stdout and "STEP " in cp.stdout
    assert podman("image", "inspect", "--format", "{{index .Labels \"io.github.toolbox.stack\"}}", tag).stdout.strip() == "cpu"

    ws = workspace(tmp_path, tiny_model, method="full", **{"train.max_steps": 6})
    cp = toolbox("run", "--engine", "docker", "--image", tag, "--workspace", str(ws),
                 "--hf-cache", str(tmp_path / "hf"), *train_argv(), env=env, timeout=900)
    assert cp.returncode == 0, cp.stdout[-5000:] + cp.stderr[-5000:]
    assert_trained(ws, tiny_model, method="full")


def _steps(build_out: str) -> list[tuple[str, str | None]]:
    """(step line, id of the cached image it was taken from, or None) per podman build step."""
    steps: list[tuple[str, str | None]] = []
    for line in build_out.splitlines():
        if re.match(r"^(\[\d+/\d+\] )?STEP \d+/\d+: ", line):
            steps.append((line, None))
        elif line.startswith("--> Using cache ") and steps:
            steps[-1] = (steps[-1][0], line.split()[-1])
    return steps


def drop_images_built_with(text: str, rounds: int = 20) -> list[str]:
    """Remove every local image (intermediates too) with a history entry containing `text`;
    children go before parents, a round at a time. Returns the ids still left."""
    hits = ["(podman image inspect gave no JSON)"]  # what is returned if no round could read the images
    for _ in range(rounds):
        ids = sorted(set(podman("images", "-aq", "--no-trunc", check=False).stdout.split()))
        if not ids:
            return []
        cp = podman("image", "inspect", *ids, check=False)
        try:
            images = json.loads(cp.stdout or "[]")
        except json.JSONDecodeError:  # an image removed between the listing and the inspect
            time.sleep(1)
            continue
        hits = [im["Id"] for im in images if any(text in (h.get("created_by") or "") for h in im.get("History") or [])]
        if not hits:
            return []
        has_child = {im.get("Parent") for im in images if im["Id"] in hits}
        leaves = [i for i in hits if i not in has_child] or hits
        podman("rmi", "-f", *leaves, check=False)
    return hits


def _stage(step: str) -> str | None:
    m = re.match(r"^\[(\d+)/\d+\] ", step)
    return m and m.group(1)


def _lineage(steps: list[str], step: str) -> set[str | None]:
    """The build stages `step`'s stage stands on (its own, its FROM's, ...), by stage number."""
    parent, names = {}, {}
    for s in steps:
        m = re.search(r": FROM (\S+)(?: AS (\S+))?", s)
        if m:
            parent[_stage(s)] = m.group(1)
            names[m.group(2)] = _stage(s)
    out, cur = set(), _stage(step)
    while cur is not None and cur not in out:
        out.add(cur)
        cur = names.get(parent.get(cur))
    return out


def test_rebuild_after_hf_pin_change_reuses_base_and_torch_layers(cpu_image, tmp_path):
    old = cpu_image["tag"]
    from toolbox.run_options import default_tag
    from toolbox.stack.load import load_stack

    # a leftover of an earlier run (or of a suite run beside this one on the same store: CI once
    # served this step from such a layer) would serve the HF step from cache: drop every image
    # whose history holds that step - the step's own image and all built on it - first
    podman("rmi", "-f", default_tag(load_stack("cpu", ["hf.peft=0.21.1"])), check=False)
    left = drop_images_built_with("peft==0.21.1")
    assert not left, f"images still holding the HF step after cleanup: {left}"
    # --unlocked: this pin set has no Python lock (the build refuses it otherwise); torch's part still holds
    cp = toolbox("build", "--stack", "cpu", "--engine", "podman", "--set", "hf.peft=0.21.1", "--unlocked",
                 "--ca-bundle", str(ca_bundle()), "--wheelhouse", str(wheelhouse()), timeout=1800)
    assert cp.returncode == 0, cp.stdout[-5000:] + cp.stderr[-5000:]
    new = next(line.split(None, 1)[1] for line in cp.stdout.splitlines() if line.startswith("image:"))
    assert new != old, "a different pin set must get a different tag"
    steps = _steps(cp.stdout)
    torch_i = next(i for i, (s, _) in enumerate(steps)
                   if "RUN" in s and ("torch==" in s or "python-lock/torch.txt" in s) and "peft" not in s)
    hf_i = next(i for i, (s, _) in enumerate(steps) if "RUN" in s and "peft==" in s)
    before = [(s, c) for s, c in steps[: torch_i + 1] if not re.search(r": FROM ", s)]  # FROM is no layer
    assert len(before) >= 5 and all(c for _, c in before), [s for s, c in before if not c]
    assert not steps[hf_i][1], "the HF step must rebuild after its pin changed"
    assert "peft==0.21.1" in steps[hf_i][0]

    def layers(ref: str) -> list[str]:
        return json.loads(podman("image", "inspect", "--format", "{{json .RootFS.Layers}}", ref).stdout)

    # the new image stands on the very layer blobs of the cached torch-step image:
    # base rootfs + the base stage's layers + the torch layer, then a new HF layer
    torch_layers, new_layers = layers(steps[torch_i][1]), layers(new)
    assert new_layers[: len(torch_layers)] == torch_layers
    lineage = _lineage([s for s, _ in steps], steps[torch_i][0])  # not the llama.cpp builder stages
    layer_steps = [s for s, _ in steps[: torch_i + 1]
                   if re.search(r": (RUN|COPY|ADD) ", s) and _stage(s) in lineage]
    assert len(torch_layers) >= 1 + len(layer_steps), (torch_layers, layer_steps)
    assert len(new_layers) > len(torch_layers), "the HF layer should be new"
    labels = json.loads(podman("image", "inspect", "--format", "{{json .Labels}}", new).stdout)
    assert labels["io.github.toolbox.peft.version"] == "0.21.1"
    podman("rmi", new, check=False)


def test_failed_stack_build_names_the_step_and_tags_nothing(cpu_image):
    from toolbox.run_options import default_tag
    from toolbox.stack.load import load_stack

    tag = default_tag(load_stack("cpu", ["hf.peft=99.0.0"]))
    cp = toolbox("build", "--stack", "cpu", "--engine", "podman", "--set", "hf.peft=99.0.0", "--unlocked",
                 "--ca-bundle", str(ca_bundle()), "--wheelhouse", str(wheelhouse()), timeout=1200)
    assert cp.returncode == 1, cp.stdout[-3000:] + cp.stderr[-3000:]
    err = cp.stderr
    # the runtime stage's pip step, though the llama.cpp builder stages run beside it
    assert re.search(r"podman build failed at \[(\d+)/\1\] STEP \d+/\d+: RUN [^\n]*peft==99\.0\.0", err), err
    assert "peft==99.0.0" in err.split("last lines:")[1]  # the engine's own last lines
    assert "what to try" in err and "no image was tagged" in err and "Traceback" not in err
    assert podman("image", "exists", tag, check=False).returncode == 1
