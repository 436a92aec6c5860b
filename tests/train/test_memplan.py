"""The memory planner's arithmetic against real tiny models (parameters, tensors kept for backward)
and its `auto` decisions. Figures for real shapes come from the GPU (docs/benchmarks.md)."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM

from toolbox_train import bench
from toolbox_train.models import arithmetic as M
from toolbox_train.planning import memory as P

TINY = ["tiny-llama", "tiny-qwen3", "tiny-gemma3"]


def _model(name: str):
    kw = dict(bench.SHAPES[name])
    cfg = AutoConfig.for_model(kw.pop("model_type"), **kw)
    torch.manual_seed(0)
    return cfg, AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16, attn_implementation="sdpa")


@pytest.mark.parametrize("name", TINY)
def test_parameter_count_matches_the_real_model(name):
    cfg, model = _model(name)
    shape = M.Shape.from_config(cfg.to_dict(), name)
    assert shape.n_params() == model.num_parameters()
    from peft import LoraConfig, get_peft_model

    peft = get_peft_model(model, LoraConfig(r=8, target_modules=list(M.LORA_ALL_LINEAR), task_type="CAUSAL_LM"))
    trainable = sum(p.numel() for p in peft.parameters() if p.requires_grad)
    assert shape.lora_params(8) == trainable


def _saved_bytes(model, ids, labels=True):
    """Bytes of distinct storages autograd keeps for backward, by decoder layer (parameters excluded)."""
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    cur: list = [None]
    seen: dict[int, tuple] = {}
    for i, layer in enumerate(model.model.layers):
        layer.register_forward_pre_hook(lambda *a, i=i: cur.__setitem__(0, i))
        layer.register_forward_hook(lambda *a: cur.__setitem__(0, None))

    def pack(t):
        st = t.untyped_storage()
        if st.data_ptr() not in params:
            seen.setdefault(st.data_ptr(), (cur[0], st.nbytes()))
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = model(input_ids=ids, labels=ids if labels else None)
    per_layer: dict = {}
    for where, n in seen.values():
        per_layer[where] = per_layer.get(where, 0) + n
    return out, per_layer


@pytest.mark.parametrize("name", TINY)
def test_layer_activation_bytes_match_saved_tensors(name):
    cfg, model = _model(name)
    shape = M.Shape.from_config(cfg.to_dict(), name)
    b, s = 2, 128
    _, per_layer = _saved_bytes(model, torch.randint(4, 500, (b, s)))
    measured = sum(v for k, v in per_layer.items() if k is not None)
    mask = b * s * s * 2 if shape.sliding_window else 0
    predicted = shape.layers * M.layer_bytes(shape, "hf") * b * s + mask
    assert abs(predicted - measured) / measured < 0.08, (predicted, measured, per_layer)
    # and the head: HF's loss keeps the fp32 log-softmax over the whole vocabulary
    assert per_layer[None] >= b * s * shape.vocab * 4


def test_checkpointing_keeps_only_layer_inputs():
    cfg, model = _model("tiny-llama")
    shape = M.Shape.from_config(cfg.to_dict())
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    b, s = 2, 128
    out, per_layer = _saved_bytes(model, torch.randint(4, 500, (b, s)))
    off_cfg, off_model = _model("tiny-llama")
    off_model.train()
    _, off_layers = _saved_bytes(off_model, torch.randint(4, 500, (b, s)))
    on = sum(v for k, v in per_layer.items() if k is not None)
    off = sum(v for k, v in off_layers.items() if k is not None)
    assert on < off / 4  # only the checkpoint's inputs survive the forward
    st = M.Setting(method="full", gradient_checkpointing=True, batch=b, seq=s, head="full")
    est_on, est_off = M.estimate(shape, st), M.estimate(shape, M.Setting(**{**st.__dict__, "gradient_checkpointing": False}))
    assert est_on.parts["activations_peak"] < est_off.parts["activations_peak"]
    out.loss.backward()  # the model really trains with it


def test_weights_and_optimizer_arithmetic():
    shape = M.Shape.from_config(bench.SHAPES["llama-1b"], "llama-1b")
    n = shape.n_params()
    assert n == 1_235_814_400  # Llama-3.2-1B
    full = M.estimate(shape, M.Setting(method="full", batch=1, seq=256, optimizer="adamw_torch_fused"))
    assert full.parts["weights"] == 2 * n and full.parts["optimizer_states"] == 4 * n and full.parts["grads"] == 2 * n
    assert full.parts["step_temp"] == 0
    foreach = M.estimate(shape, M.Setting(method="full", batch=1, seq=256, optimizer="adamw_torch"))
    assert foreach.parts["step_temp"] == 2 * n  # torch's foreach AdamW: one sqrt copy of the states
    q = M.estimate(shape, M.Setting(method="qlora", batch=1, seq=256))
    lin = shape.params()["layers_linear"]
    assert 0.5 * lin + 2 * (n - lin) < q.parts["weights"] < 0.53 * lin + 2 * (n - lin) + 1e8
    fsdp2 = M.estimate(shape, M.Setting(method="full", strategy="fsdp", world_size=2))
    fsdp1 = M.estimate(shape, M.Setting(method="full", strategy="fsdp", world_size=1))
    assert fsdp2.parts["optimizer_states"] == fsdp1.parts["optimizer_states"] / 2
    ddp = M.estimate(shape, M.Setting(method="full", strategy="ddp", world_size=2))
    single = M.estimate(shape, M.Setting(method="full"))
    assert ddp.peak > single.peak


def test_activation_terms_scale_with_tokens():
    shape = M.Shape.from_config(bench.SHAPES["llama-1b"])
    a = M.estimate(shape, M.Setting(method="lora", gradient_checkpointing=False, batch=1, seq=2048))
    b = M.estimate(shape, M.Setting(method="lora", gradient_checkpointing=False, batch=2, seq=2048))
    fixed = a.parts["weights"] + a.parts["optimizer_states"]
    assert (b.peak - fixed) == pytest.approx(2 * (a.peak - fixed), rel=0.1)


def test_auto_checkpointing_decisions():
    shape = M.Shape.from_config(bench.SHAPES["llama-1b"], "llama-1b")
    st = M.Setting(method="full", backend="hf", liger=True, batch=8, seq=2048)
    d = P.decide_checkpointing(shape, st, 139 * M.GiB)
    assert d.gradient_checkpointing is False and "off" in d.reason
    d = P.decide_checkpointing(shape, st, 24 * M.GiB)  # fits only with checkpointing
    assert d.gradient_checkpointing is True and d.fits
    d = P.decide_checkpointing(shape, st, 4 * M.GiB)
    assert d.gradient_checkpointing is True and not d.fits
    assert P.alternatives(shape, st, 4 * M.GiB)  # something smaller would fit
    d = P.decide_checkpointing(shape, M.Setting(method="lora", backend="unsloth"), 139 * M.GiB)
    assert d.gradient_checkpointing == "unsloth"
    assert P.decide_checkpointing(shape, st, None).gradient_checkpointing is True


def test_sizes_and_longest_sequence():
    assert M.parse_size("128GiB") == 128 * 2**30 == M.parse_size("128G")
    assert M.parse_size("137GB") == 137 * 10**9
    with pytest.raises(ValueError):
        M.parse_size("lots")
    shape = M.Shape.from_config(bench.SHAPES["llama-1b"])
    st = M.Setting(method="lora", backend="unsloth", gradient_checkpointing="unsloth")
    n = P.longest_seq(shape, st, 16 * M.GiB)
    assert n > 0 and M.estimate(shape, M.Setting(**{**st.__dict__, "seq": n})).peak <= 16 * M.GiB
    assert M.estimate(shape, M.Setting(**{**st.__dict__, "seq": n + 1024})).peak > 16 * M.GiB


def test_planner_within_15_percent_of_the_h200_measurements():
    """The GPU's measured peaks (docs/bench/memplan-h200.json) against the planner as it is now."""
    import json
    from pathlib import Path

    from toolbox_train.bench import calibration

    data = json.loads((Path(__file__).resolve().parents[2] / "docs/bench/memplan-h200.json").read_text())
    rows = [r for r in data["rows"] if r.get("measured_gib")]
    assert len(rows) >= 10 and {r["shape"] for r in rows} == {"llama-1b", "qwen3-0.6b", "gemma3-1b"}
    assert {r["method"] for r in rows} == {"full", "lora", "qlora", "lora-8bit"}
    assert {str(r["gc"]) for r in rows} >= {"True", "False", "unsloth"} and len({r["seq"] for r in rows}) >= 2
    for r in rows:
        shape = M.Shape.from_config(bench.SHAPES[r["shape"]], r["shape"])
        est = M.estimate(shape, calibration.setting_for(r["backend"], r["method"], r["gc"], r["batch"], r["seq"]))
        assert abs(est.peak_gib / r["measured_gib"] - 1) <= 0.15, (r["id"], est.peak_gib, r["measured_gib"])


def test_public_shapes_and_the_strix_table():
    # parameter counts of the public models (their model cards): the config dicts are right
    want = {"gemma-3-4b": 4.3, "gemma-3-12b": 12.2, "gemma-3-27b": 27.4, "qwen3-8b": 8.2, "qwen3-14b": 14.8,
            "qwen3-32b": 32.8, "llama-3.1-8b": 8.0, "gpt-oss-20b": 20.9}
    for name, b in want.items():
        assert M.Shape.from_config(P.PUBLIC_SHAPES[name]).n_params() / 1e9 == pytest.approx(b, abs=0.06), name
    rows = {(r["model"], r["backend"], r["method"]): r for r in P.strix_rows(128 * M.GiB)}
    assert rows[("gemma-3-27b", "hf", "full")]["longest_seq"] == 0  # 27B full does not fit 128 GiB
    for name in want:
        assert rows[(name, "hf", "qlora")]["longest_seq"] >= rows[(name, "hf", "lora")]["longest_seq"]
        assert rows[(name, "hf", "qlora")]["peak_gib_at_512"] < rows[(name, "hf", "lora")]["peak_gib_at_512"]
    assert "does not fit" in P.render_strix(list(rows.values()))


# ------------------------------------------------------------------ finetune / launch integration


def _tiny_run(tmp_path, **train):
    import subprocess
    import sys

    import yaml

    model = tmp_path / "model"
    bench.build_model_dir("tiny-llama", model)
    data = bench.write_text_dataset(tmp_path / "data.jsonl", 8, 80, 500)
    cfg = {"model": {"path": str(model)}, "data": {"path": str(data), "format": "text", "max_seq_length": 64},
           "method": "full", "train": {"per_device_batch_size": 2, "max_steps": 1, **train},
           "output": {"dir": str(tmp_path / "out"), "progress_bar": False}}
    path = tmp_path / "train.yaml"
    path.write_text(yaml.safe_dump(cfg))

    def run(*args, mod="toolbox_train.commands.finetune"):
        return subprocess.run([sys.executable, "-m", mod, *args], capture_output=True, text=True, timeout=600)
    return path, run


def test_finetune_plan_refusal_and_resolved_checkpointing(tmp_path):
    import yaml

    cfg, run = _tiny_run(tmp_path)
    # (planned for a GPU machine: backend auto would be Unsloth there, as the toolbox images have it)
    shown = run("--config", str(cfg), "--plan", "--device-memory", "16GiB", "--set", "backend=hf")
    assert shown.returncode == 0, shown.stderr
    assert "| setting |" in shown.stdout and "<-" in shown.stdout and "gradient checkpointing False" in shown.stdout
    assert not (tmp_path / "out").exists()  # --plan writes nothing
    # too little memory: refused before any weight is loaded, naming what would fit; nothing written
    small = run("--config", str(cfg), "--device-memory", "1MiB")
    assert small.returncode == 2 and "memory: predicted peak" in small.stderr and "Traceback" not in small.stderr
    assert not (tmp_path / "out").exists()
    assert run("--config", str(cfg), "--plan", "--device-memory", "1MiB").returncode == 2
    bad = run("--config", str(cfg), "--plan", "--device-memory", "plenty")
    assert bad.returncode == 2 and "--device-memory" in bad.stderr
    # a real (CPU) run: auto resolves, the banner and config.resolved.yaml say what and why
    done = run("--config", str(cfg), "--device-memory", "16GiB")
    assert done.returncode == 0, done.stderr[-2000:]
    assert "memory plan: predicted peak" in done.stderr
    resolved = yaml.safe_load((tmp_path / "out" / "config.resolved.yaml").read_text())["_resolved"]
    assert resolved["gradient_checkpointing"] is False and "fits" in resolved["gradient_checkpointing_reason"]
    assert resolved["device_memory_gib"] == 16.0 and resolved["predicted_peak_gib"] > 0


def test_launch_plan_prints_per_device_and_starts_nothing(tmp_path):
    cfg, run = _tiny_run(tmp_path)
    out = run("--strategy", "ddp", "--cpu", "--nproc", "2", "--", "finetune", "--config", str(cfg), "--plan",
              "--device-memory", "8GiB", mod="toolbox_train.commands.launch")
    assert out.returncode == 0, out.stderr
    assert "ddp x2" in out.stdout and not (tmp_path / "out").exists()


def _shape_only(tmp_path, shape: str, **cfg_over):
    """A model folder holding only the config.json of a bench shape (the planner needs no weights)."""
    import yaml
    from transformers import AutoConfig

    kw = dict(bench.SHAPES[shape])
    AutoConfig.for_model(kw.pop("model_type"), **kw).save_pretrained(tmp_path / shape)
    (tmp_path / "d.jsonl").write_text('{"text": "w4 w5"}\n')
    cfg = {"model": {"path": str(tmp_path / shape)}, "data": {"path": str(tmp_path / "d.jsonl"), "max_seq_length": 2048},
           "method": "full", "backend": "hf", "train": {"per_device_batch_size": 8},
           "output": {"dir": str(tmp_path / "out")}}
    for k, v in cfg_over.items():
        cfg[k] = {**cfg[k], **v} if isinstance(v, dict) else v
    (tmp_path / "train.yaml").write_text(yaml.safe_dump(cfg))
    return tmp_path / "train.yaml"


def test_plan_for_the_target_machine_not_this_one(tmp_path):
    """issue 26: on this CPU host, `--plan --machine/--device-memory` plans the GPU run as it will run there:
    Liger and TRL's fused head (not fp32 logits), bf16, Unsloth accepted although not installed here."""
    import subprocess
    import sys

    cfg = _shape_only(tmp_path, "llama-1b")

    def plan(*args):
        r = subprocess.run([sys.executable, "-m", "toolbox_train.commands.finetune", "--config", str(cfg), "--plan",
                            *args], capture_output=True, text=True, timeout=300)
        assert "Traceback" not in r.stderr
        return r

    here = plan()  # this machine: a CPU, no device memory known
    assert here.returncode == 0 and "full hf no ckpt b8 s2048 | 4.6" in here.stdout  # fp32, the full logits
    h200 = plan("--machine", "h200")
    assert h200.returncode == 0, h200.stderr
    assert "planned for h200 (139 GiB): backend hf, liger True, precision bf16" in h200.stdout
    picked = [ln for ln in h200.stdout.splitlines() if ln.endswith("| <- |")]
    assert len(picked) == 1 and "full liger no ckpt b8 s2048" in picked[0]
    assert 25 < float(picked[0].split("|")[5]) < 31  # measured on the H200: 27.5 GiB (docs/benchmarks.md)
    assert plan("--device-memory", "139GiB").stdout.count("liger no ckpt b8") == 1  # the same, unnamed
    strix = plan("--machine", "strix-halo", "--set", "backend=unsloth", "--set", "method=lora")
    assert strix.returncode == 0, strix.stderr  # refused here before: unsloth is not installed on this host
    assert "strix-halo (128 GiB, unified memory): backend unsloth" in strix.stdout and "unsloth offloaded ckpt" in strix.stdout
    # the speed pick: the largest batch without checkpointing within the margin, at most 32k tokens a micro-batch
    auto = plan("--machine", "h200", "--set", "train.per_device_batch_size=auto")
    assert "train.per_device_batch_size: auto -> 16 (" in auto.stdout and "| full liger no ckpt b16 s2048 |" in auto.stdout
    small = plan("--device-memory", "12GiB", "--set", "train.per_device_batch_size=auto")
    assert "auto -> 2 (" in small.stdout and "with checkpointing True" in small.stdout
    split = plan("--machine", "h200", "--set", "train.per_device_batch_size=auto", "--set", "train.batch_size=24")
    assert "auto -> 8 (" in split.stdout  # a divisor of the global batch
    bad = subprocess.run([sys.executable, "-m", "toolbox_train.commands.finetune", "--config", str(cfg),
                          "--target", "h200"], capture_output=True, text=True, timeout=300)
    assert bad.returncode == 2 and "--target: only with --plan" in bad.stderr and not (tmp_path / "out").exists()


def test_preference_plan_within_15_percent_of_the_measured_rows():
    """`finetune --plan`'s peak for the preference rows of docs/bench/dpo_rows.py (llama-1b, prompt 512 +
    completion 512, batch 4, LoRA r16) against the peaks measured on 2026-12-06: an H200's
    (docs/bench/2026-12-06-h200/pref/rows.json, transcribed from that call's table) and an H100's raw files
    (docs/bench/2026-12-06-h100/call-rows/pref/{dpo,orpo}-rows.json, as dpo_rows.py wrote them). DPO's and
    ORPO's on the HF backend above all (ORPO reads the model's full logits, KTO's KL rows keep no
    activations), each backend's with the plan's own choice for that device's memory."""
    import importlib.util
    import json
    from pathlib import Path

    from toolbox_train.config.schema import load_config

    root = Path(__file__).resolve().parents[2]
    spec = importlib.util.spec_from_file_location("dpo_rows", root / "docs/bench/dpo_rows.py")
    rows_mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(rows_mod)
    data = json.loads((root / "docs/bench/2026-12-06-h200/pref/rows.json").read_text())
    h200 = {(r["objective"], r["path"]): r["peak_gib"] for r in data["rows"] if "peak_gib" in r}
    assert {("dpo", "finetune"), ("orpo", "finetune"), ("kto", "finetune")} <= set(h200)
    raw = root / "docs/bench/2026-12-06-h100/call-rows/pref"
    h100 = {(r["objective"], r["path"]): r["peak_gib"]
            for f in ("dpo-rows.json", "orpo-rows.json") for r in json.loads((raw / f).read_text())
            if r["path"] == "finetune" and r["shape"] == "llama-1b"}  # trl-unsloth is not finetune's plan
    assert set(h100) == {("dpo", "finetune"), ("orpo", "finetune")}
    model = dict(bench.SHAPES["llama-1b"])
    # device memory as torch reports it: H200 139.8 GiB, H100 80GB HBM3 79.2 GiB (summary.json of that call)
    cases = [(k, gib, 139.8) for k, gib in h200.items()] + [(k, gib, 79.2) for k, gib in h100.items()]
    for (objective, path), gib, device_gib in cases:
        backend = "unsloth" if path == "finetune-unsloth" else "hf"
        cfg, _ = load_config({
            "model": {"path": "llama-1b"}, "objective": objective, "backend": backend,
            "method": "qlora" if path == "finetune-qlora" else "lora",
            "data": {"path": "pairs.jsonl", "max_seq_length": rows_mod.PROMPT + rows_mod.COMPLETION},
            "lora": {"r": rows_mod.R, "alpha": 2 * rows_mod.R},
            # TRL's DPOTrainer run directly: its DPOConfig turns checkpointing on
            "train": {"per_device_batch_size": rows_mod.BATCH, "max_steps": 1,
                      **({"gradient_checkpointing": True} if path == "trl" else {})},
            "output": {"dir": "out"}})
        tp = P.plan_training(cfg, model, backend, liger=False, device_bytes=device_gib * M.GiB, gpu=True)
        assert abs(M.estimate(tp.shape, tp.setting).peak_gib / gib - 1) <= 0.15, (
            objective, path, device_gib, tp.setting, gib)
