"""GPT-OSS's fused experts (3-D nn.Parameters, not nn.Linear): LoRA on the HF backend reaches them through
PEFT's target_parameters as Unsloth's get_peft_model does; the planner counts those adapters; merge works
(issue 26)."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
import yaml
from safetensors import safe_open
from transformers import TrainerCallback

from helpers.tiny import train_config
from toolbox_train import bench
from toolbox_train.export import model as export
from toolbox_train.models import arithmetic as M
from toolbox_train.commands import finetune

EXPERTS = ["mlp.experts.gate_up_proj", "mlp.experts.down_proj"]


@pytest.fixture(scope="module")
def gpt_oss(tmp_path_factory):
    return bench.build_model_dir("tiny-gpt-oss", tmp_path_factory.mktemp("gptoss") / "model")


def _tiny_config():
    from transformers import AutoConfig

    kw = dict(bench.SHAPES["tiny-gpt-oss"])
    return AutoConfig.for_model(kw.pop("model_type"), **kw)


@pytest.mark.parametrize("targets,want", [
    ("all-linear", EXPERTS), (list(M.LORA_ALL_LINEAR), EXPERTS), (["q_proj", "v_proj"], []),
    (["q_proj", "up_proj"], ["mlp.experts.gate_up_proj"]), (["down_proj"], ["mlp.experts.down_proj"]),
])
def test_expert_targets(targets, want):
    assert M.expert_targets("gpt_oss", targets) == want
    assert M.expert_targets("llama", targets) == []  # dense: nothing changes


@pytest.mark.parametrize("targets", ["all-linear", ["q_proj", "v_proj"], ["k_proj", "gate_proj"],
                                     ["down_proj", "o_proj"]])
def test_planner_counts_expert_adapters(targets):
    """Shape.lora_params equals PEFT's trainable count on the built model, for what the HF path builds."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    cfg = _tiny_config()
    model = AutoModelForCausalLM.from_config(cfg)
    experts = M.expert_targets("gpt_oss", targets)
    lc = LoraConfig(r=8, target_modules=targets,
                    task_type="CAUSAL_LM", **({"target_parameters": experts} if experts else {}))
    trainable, _ = get_peft_model(model, lc).get_nb_trainable_parameters()
    shape = M.Shape.from_config(cfg.to_dict())
    assert shape.lora_params(8, targets) == trainable
    # both backends' estimates hold the expert adapters (Unsloth's get_peft_model adapts the same parameters)
    attn = [t for t in (M.LORA_ALL_LINEAR if targets == "all-linear" else targets)
            if t in ("q_proj", "k_proj", "v_proj", "o_proj")]
    extra = shape.lora_params(8, targets) - shape.lora_params(8, attn)
    assert (extra > 0) == bool(experts)
    for backend, tb in (("hf", 4), ("unsloth", 2)):  # adapters in fp32 on the HF path, bf16 in Unsloth's
        a, b = (M.estimate(shape, M.Setting(method="lora", backend=backend, lora_r=8, lora_targets=t, seq=64))
                for t in (targets, attn))
        assert a.parts["weights"] - b.parts["weights"] == extra * tb


def test_planner_20b_counts_experts():
    """GPT-OSS-20B: ~7.4M expert adapter parameters per layer at r 16, on top of attention's."""
    from toolbox_train.planning.memory import PUBLIC_SHAPES

    s = M.Shape.from_config(PUBLIC_SHAPES["gpt-oss-20b"])
    attn = s.lora_params(16, ["q_proj", "k_proj", "v_proj", "o_proj"])
    per_layer = (s.lora_params(16) - attn) / s.layers
    assert per_layer == 16 * 32 * ((2880 + 5760) + (2880 + 2880))  # 7,372,800


class _Snapshot(TrainerCallback):
    """The experts' base weights and their adapters, before and after training."""

    def __init__(self):
        self.before, self.after = {}, {}

    @staticmethod
    def _take(model):
        return {n: p.detach().clone() for n, p in model.named_parameters() if ".experts." in n}

    def on_train_begin(self, args, state, control, model=None, **kw):
        self.before = self._take(model)

    def on_train_end(self, args, state, control, model=None, **kw):
        self.after = self._take(model)


@pytest.fixture(scope="module")
def moe_run(gpt_oss, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("moerun")
    data = bench.write_text_dataset(tmp / "data.jsonl", 16, 40, 500)
    snap = _Snapshot()
    cfg = train_config(gpt_oss, data, tmp / "out", **{
        "method": "lora", "lora.r": 4, "lora.alpha": 8, "train.learning_rate": 2e-2, "train.max_steps": 3,
        "data.max_seq_length": 64, "output.save_steps": 3})
    summary = finetune.run(cfg, callbacks=[snap])
    return tmp / "out", summary, snap


def test_hf_lora_trains_expert_adapters(moe_run):
    out, s, snap = moe_run
    lora = [n for n in snap.before if "lora_" in n]
    base = [n for n in snap.before if "lora_" not in n]  # gate_up_proj, down_proj and their biases
    assert len(lora) == 2 * 2 * 2  # 2 layers x 2 expert parameters x A/B
    assert len(base) == 2 * 4 and all(n.endswith(("gate_up_proj", "down_proj", "_bias")) for n in base)
    for n in lora:
        if ".lora_B." in n:  # B starts at zero: training moved it
            assert not torch.equal(snap.before[n], snap.after[n]), n
    assert base and all(torch.equal(snap.before[n], snap.after[n]) for n in base)
    with safe_open(str(out / "adapter_model.safetensors"), framework="pt") as f:
        assert sum(".experts." in k for k in f.keys()) == 8
    cfg = json.loads((out / "adapter_config.json").read_text())
    assert sorted(cfg["target_parameters"]) == sorted(EXPERTS)
    resolved = yaml.safe_load((out / "config.resolved.yaml").read_text())
    assert resolved["_resolved"]["lora_target_parameters"] == EXPERTS


def test_plan_shows_expert_targets_and_counts_them(moe_run, gpt_oss, tmp_path, capsys):
    """--plan prints the note; the planner's trainable count equals PEFT's for what finetune built."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    out, _, _ = moe_run
    data = bench.write_text_dataset(tmp_path / "d.jsonl", 4, 20, 500)
    cfg = tmp_path / "train.yaml"
    cfg.write_text(yaml.safe_dump(train_config(gpt_oss, data, tmp_path / "o", **{"method": "lora", "lora.r": 4})))
    assert finetune.main(["--config", str(cfg), "--plan"]) == 0
    printed = capsys.readouterr().out
    assert "target_parameters mlp.experts.gate_up_proj, mlp.experts.down_proj" in printed
    model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(gpt_oss), str(out))
    trainable = sum(p.numel() for n, p in model.named_parameters() if "lora_" in n)
    shape = M.Shape.from_config(json.loads((gpt_oss / "config.json").read_text()))
    assert shape.lora_params(4) == pytest.approx(trainable, rel=0.01)


def test_dense_config_unchanged(tmp_path):
    """A dense model: no target_parameters in the PEFT config, no note, no resolved key."""
    from types import SimpleNamespace

    from toolbox_train.units import registry
    from toolbox_train.models.lora import lora_target_parameters, peft_config

    cfg = SimpleNamespace(lora=SimpleNamespace(r=4, alpha=8, dropout=0.0, target_modules="all-linear"),
                          method="lora")
    p = SimpleNamespace(cfg=cfg, multimodal=False, model_config=SimpleNamespace(model_type="llama"),
                        objective=registry.REGISTRY["sft"])
    assert lora_target_parameters(p) == []
    assert not peft_config(p).target_parameters


def test_dropout_with_experts_is_refused(gpt_oss, tmp_path, capsys):
    data = bench.write_text_dataset(tmp_path / "d.jsonl", 4, 20, 500)
    cfg = tmp_path / "train.yaml"
    cfg.write_text(yaml.safe_dump(train_config(gpt_oss, data, tmp_path / "o",
                                               **{"method": "lora", "lora.dropout": 0.1})))
    assert finetune.main(["--config", str(cfg), "--plan"]) == 2
    err = capsys.readouterr().err
    assert "lora.dropout: 0.1: PEFT's adapters on gpt_oss's fused experts" in err


def test_merged_export_of_expert_adapters(moe_run, gpt_oss, tmp_path):
    """export-model --to merged: the merged experts give PEFT's logits; the base experts changed."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    out, _, _ = moe_run
    merged_dir = tmp_path / "merged"
    assert export.main(["--run", str(out), "--to", "merged", "--dtype", "fp32", "--out", str(merged_dir)]) == 0
    peft = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(gpt_oss, dtype=torch.float32),
                                     str(out)).eval()
    merged = AutoModelForCausalLM.from_pretrained(merged_dir, dtype=torch.float32).eval()
    base = AutoModelForCausalLM.from_pretrained(gpt_oss, dtype=torch.float32).eval()
    batch = torch.randint(0, merged.config.vocab_size, (2, 16), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        a, b = peft(batch).logits, merged(batch).logits
    assert (a - b).abs().max().item() <= 1e-3
    k = "model.layers.0.mlp.experts.down_proj"
    assert not torch.equal(merged.state_dict()[k], base.state_dict()[k])
    assert not any("lora_" in k for f in merged_dir.glob("*.safetensors") for k in safe_open(str(f), "pt").keys())


def test_resume_check_sees_expert_adapters(moe_run):
    """resume's meta-device PEFT model has the same adapter tensors as the run saved, experts included."""
    from toolbox_train.planning.run import resolve
    from toolbox_train.runs import resume

    out, _, _ = moe_run
    resolved = yaml.safe_load((out / "config.resolved.yaml").read_text())
    p = resolve({k: v for k, v in resolved.items() if not k.startswith("_")}, check_output=False)
    shapes, _ = resume.expected_weights(p)
    with safe_open(str(out / "adapter_model.safetensors"), framework="pt") as f:
        assert shapes == {k: list(f.get_slice(k).get_shape()) for k in f.keys()}
    assert sum(".experts." in k for k in shapes) == 8
    assert resume.differences(out / "checkpoints" / "checkpoint-3", p) == []


@pytest.fixture(scope="module")
def qwen3_moe(tmp_path_factory):
    from helpers.tiny import make_tiny_model

    return make_tiny_model(tmp_path_factory.mktemp("qmoe") / "model", "qwen3-moe")


@pytest.mark.parametrize("targets", [["gate_proj", "down_proj"], ["q_proj", "up_proj"]])
@pytest.mark.parametrize("plan", [True, False])
def test_peft_converted_experts_half_of_a_fused_pair_is_refused(qwen3_moe, targets, plan, tmp_path, capsys):
    """Qwen3-MoE's experts are PEFT's to convert: gate_proj and up_proj are one fused parameter now, so
    naming one without the other is one line naming the field, exit 2, before any weights load or any file."""
    data = bench.write_text_dataset(tmp_path / "d.jsonl", 4, 20, 500)
    cfg = tmp_path / "train.yaml"
    cfg.write_text(yaml.safe_dump(train_config(qwen3_moe, data, tmp_path / "o",
                                               **{"method": "lora", "lora.target_modules": targets})))
    assert finetune.main(["--config", str(cfg), *(["--plan"] if plan else [])]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"lora.target_modules: {targets}: Cannot convert PEFT target(s)" in err[0], err
    assert err[0].startswith(f"finetune: error: {cfg}:") and "Traceback" not in err[0]
    assert not (tmp_path / "o").exists()


def test_peft_converted_experts_whole_pair_trains_them(qwen3_moe, tmp_path):
    """gate_proj + up_proj + down_proj: PEFT adapts the fused experts, and they train."""
    data = bench.write_text_dataset(tmp_path / "d.jsonl", 8, 20, 500)
    cfg = tmp_path / "train.yaml"
    out = tmp_path / "o"
    cfg.write_text(yaml.safe_dump(train_config(qwen3_moe, data, out, **{
        "method": "lora", "train.max_steps": 2, "lora.target_modules": ["gate_proj", "up_proj", "down_proj"]})))
    assert finetune.main(["--config", str(cfg)]) == 0
    with safe_open(str(out / "adapter_model.safetensors"), "pt") as f:
        keys = list(f.keys())
    assert any("mlp.experts" in k and "lora_A" in k for k in keys), keys


@pytest.mark.parametrize("targets", ["all-linear", ["q_proj", "gate_proj", "up_proj"]])
def test_plan_counts_the_adapter_peft_builds_for_converted_experts(qwen3_moe, targets, tmp_path):
    """The memory plan's adapter is the one PEFT builds (experts at rank 2r for gate_up, the router with
    all-linear), not the arithmetic's attention-only count: equal to the trainable parameters of the run."""
    from toolbox_train.planning import run as checks

    data = bench.write_text_dataset(tmp_path / "d.jsonl", 8, 20, 500)
    cfg = tmp_path / "train.yaml"
    out = tmp_path / "o"
    cfg.write_text(yaml.safe_dump(train_config(qwen3_moe, data, out, **{
        "method": "lora", "lora.r": 4, "train.max_steps": 1, "lora.target_modules": targets})))
    p = checks.resolve(str(cfg))
    st = p.memory.setting
    assert f"PEFT adapts qwen3_moe's experts itself: {st.lora_params:,} adapter parameters" in "\n".join(p.notes)
    arithmetic = p.memory.shape.lora_params(4, targets)
    trained = {}

    class Count(TrainerCallback):
        def on_train_begin(self, args, state, control, model=None, **kw):
            trained["n"] = sum(x.numel() for x in model.parameters() if x.requires_grad)

    finetune.run(str(cfg), callbacks=[Count()])
    assert st.lora_params == trained["n"] > arithmetic, (st.lora_params, trained, arithmetic)
    e = M.estimate(p.memory.shape, st)
    assert e.parts["weights"] - M.estimate(p.memory.shape, dataclasses.replace(st, lora_params=0)).parts["weights"] \
        == trained["n"] * 4  # fp32 adapters on backend hf


@pytest.mark.parametrize("targets,unmatched", [(["foo"], "foo matches"), (["q_proj", "foo", "bar"], "foo, bar match")])
@pytest.mark.parametrize("plan", [True, False])
def test_a_target_module_matching_nothing_is_refused_on_a_dense_model(tiny_model, targets, unmatched, plan,
                                                                        tmp_path, capsys):
    """A Llama with lora.target_modules [foo] ended as 'internal error: NoMatchingPeftModuleError' after the
    weights loaded, config.resolved.yaml written; [q_proj, foo] trained q_proj alone, foo silently ignored."""
    data = bench.write_text_dataset(tmp_path / "d.jsonl", 4, 20, 500)
    cfg = tmp_path / "train.yaml"
    cfg.write_text(yaml.safe_dump(train_config(tiny_model, data, tmp_path / "o",
                                               **{"method": "lora", "lora.target_modules": targets})))
    assert finetune.main(["--config", str(cfg), *(["--plan"] if plan else [])]) == 2
    raw = capsys.readouterr().err
    err = [ln for ln in raw.splitlines() if "error" in ln]
    assert len(err) == 1 and "Traceback" not in raw, raw
    assert err[0].startswith(f"finetune: error: {cfg}:"), err
    assert f"lora.target_modules: {unmatched} no module of llama (its modules: embed_tokens, q_proj, k_proj, " \
           "v_proj, o_proj, gate_proj, up_proj, down_proj, lm_head; or all-linear)" in err[0], err
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("model,targets,ok", [
    ("qwen3-moe", ["gate_proj", "up_proj", "foo"], False), ("qwen3-moe", ["gate_proj", "up_proj", "q_proj"], True),
    ("gpt-oss", ["q_proj", "foo"], False), ("gpt-oss", ["q_proj", "gate_proj", "up_proj", "down_proj"], True)])
def test_moe_target_entries_count_the_experts_they_select(qwen3_moe, gpt_oss, model, targets, ok, tmp_path, capsys):
    """On MoE models an MLP name selects the experts (PEFT's conversion, GPT-OSS's target_parameters): matched;
    a name that selects nothing is still refused."""
    data = bench.write_text_dataset(tmp_path / "d.jsonl", 4, 20, 500)
    cfg = tmp_path / "train.yaml"
    cfg.write_text(yaml.safe_dump(train_config(qwen3_moe if model == "qwen3-moe" else gpt_oss, data, tmp_path / "o",
                                               **{"method": "lora", "lora.target_modules": targets})))
    assert finetune.main(["--config", str(cfg), "--plan"]) == (0 if ok else 2)
    err = capsys.readouterr().err
    assert ok or "lora.target_modules: foo matches no module of " in err and "the experts: gate_proj" in err, err
