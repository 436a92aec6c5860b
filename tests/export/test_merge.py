"""export --to merged: logits equal PEFT's, 16-bit output, QLoRA never 4-bit; the refusals."""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest
import yaml
from safetensors import safe_open

from exportkit import finetune_run
from toolbox_train.export import model as export


@pytest.fixture(scope="module")
def lora_run(tiny_model, tmp_path_factory):
    return finetune_run(tiny_model, tmp_path_factory.mktemp("lora") / "run")


def _dtypes(folder):
    out = set()
    for f in folder.glob("*.safetensors"):
        with safe_open(str(f), framework="pt") as st:
            out |= {str(st.get_slice(k).get_dtype()) for k in st.keys()}
    return out


def test_merged_logits_equal_peft(lora_run, tiny_model, tmp_path):
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    out = tmp_path / "merged"
    assert export.main(["--run", str(lora_run), "--to", "merged", "--dtype", "fp32", "--out", str(out)]) == 0
    peft = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32),
                                     str(lora_run)).eval()
    merged = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    batch = torch.randint(0, merged.config.vocab_size, (3, 24), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        a, b = peft(batch).logits, merged(batch).logits
        base = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32).eval()(batch).logits
    assert (a - b).abs().max().item() <= 1e-3
    assert (a - base).abs().max().item() > 1e-2  # the adapter changed something: the check can fail
    assert (out / "tokenizer.json").is_file() and (out / "chat_template.jinja").is_file()
    assert not any("lora_" in k for f in out.glob("*.safetensors") for k in safe_open(str(f), "pt").keys())
    meta = json.loads((out / "export.json").read_text())
    assert meta["kind"] == "adapter" and {f["path"] for f in meta["files"]} >= {"model.safetensors", "config.json"}


def test_default_is_16_bit(lora_run, tmp_path, capsys):
    out = tmp_path / "m16"
    assert export.main(["--run", str(lora_run), "--to", "merged", "--out", str(out)]) == 0
    assert _dtypes(out) == {"BF16"}
    cap = capsys.readouterr()
    assert "wrote model.safetensors (" in cap.err and "export-model: done in" in cap.out


def test_qlora_run_merges_into_16_bit_base(lora_run, tmp_path, capsys):
    run = tmp_path / "qrun"
    shutil.copytree(lora_run, run)
    cfg = yaml.safe_load((run / "config.resolved.yaml").read_text())
    cfg["method"] = "qlora"  # what a GPU QLoRA run records; its adapter has the same form
    (run / "config.resolved.yaml").write_text(yaml.safe_dump(cfg))
    assert export.main(["--run", str(run), "--to", "merged"]) == 0
    out = run / "export" / "merged"
    assert _dtypes(out) == {"BF16"}
    assert "quantization_config" not in json.loads((out / "config.json").read_text())
    assert "never into 4-bit" in capsys.readouterr().err


# ---------------------------------------------------------------- refusals: exit 2, nothing written


def _refused(argv, capsys, match):
    rc = export.main(argv)
    err = capsys.readouterr().err
    assert rc == 2, err
    assert match in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1


def test_refuses_unfinished_run(lora_run, tmp_path, capsys):
    run = tmp_path / "unfinished"
    shutil.copytree(lora_run, run)
    (run / "summary.json").unlink()
    _refused(["--run", str(run), "--to", "merged"], capsys, "no finished model")
    assert not (run / "export").exists()
    _refused(["--run", str(tmp_path / "nope"), "--to", "merged"], capsys, "no such folder")


def test_refuses_unknown_quant(lora_run, capsys):
    _refused(["--run", str(lora_run), "--to", "gguf", "--quant", "f16,q9_k"], capsys, "unknown quant type 'q9_k'")
    assert not (lora_run / "export").exists()


def test_refuses_existing_output(lora_run, tmp_path, capsys):
    out = tmp_path / "taken"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    _refused(["--run", str(lora_run), "--to", "merged", "--out", str(out)], capsys, "pass --overwrite")
    assert [p.name for p in out.iterdir()] == ["keep.txt"]
    assert export.main(["--run", str(lora_run), "--to", "merged", "--out", str(out), "--overwrite"]) == 0
    assert not (out / "keep.txt").exists() and (out / "model.safetensors").is_file()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


def test_refuses_too_little_disk(lora_run, tmp_path, capsys):
    small = tmp_path / "small"
    small.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(small)]).returncode != 0:
        pytest.skip("cannot mount a small tmpfs here (not root?)")
    try:
        _refused(["--run", str(lora_run), "--to", "merged", "--out", str(small / "m")], capsys, "too little disk")
        assert list(small.iterdir()) == []
    finally:
        subprocess.run(["umount", str(small)], check=True)
