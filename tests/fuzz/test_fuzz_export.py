"""Fuzzing export-model and evaluate (issue 23): generated arguments and damaged run folders.

Properties, for every input: exit 0, or 2 with one line that names a flag or a file, or 1 with
one line (a fault); never a traceback, never a hang; a refusal or a fault leaves the run folder
and an existing output byte-identical, and leaves no temporary file behind.

Examples call main() in-process on one small finished LoRA run (copied per example when it is
damaged). Export only merges (`--to merged`, seconds) and evaluate uses `--runtime hf`; llama.cpp
is not needed. The budget is small and derandomized for CI; TOOLBOX_FUZZ=random explores new
examples, TOOLBOX_FUZZ_EXPORT_EXAMPLES=N sets how many.
"""

from __future__ import annotations

import contextlib
import io
import os
import shutil
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from helpers.tiny import train_config, write_dataset
from toolbox_train.export import evaluate, model as export
from toolbox_train.commands import finetune

EXAMPLES = int(os.environ.get("TOOLBOX_FUZZ_EXPORT_EXAMPLES", "15"))
FUZZ = settings(max_examples=EXAMPLES, deadline=None, database=None,
                derandomize=os.environ.get("TOOLBOX_FUZZ") != "random",
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                       HealthCheck.function_scoped_fixture])


@pytest.fixture(scope="module")
def world(tmp_path_factory, tiny_models):
    d = tmp_path_factory.mktemp("fuzz-export")
    data = write_dataset(d / "d.jsonl", "text", n=24)
    run = d / "run"
    finetune.run(train_config(tiny_models("llama"), data, run, **{
        "method": "lora", "lora.r": 4, "train.max_steps": 2, "output.save_steps": 1, "data.eval_split": 0.25}))
    os.mkfifo(d / "fifo.jsonl")
    w = {"dir": d, "run": run, "data": data, "data_bytes": data.read_bytes()}
    _reset(w)
    return w


def _reset(world) -> None:
    """The fixed files as they were: a successful example may have replaced one (--out d.jsonl)."""
    d = world["dir"]
    for p in (d / "existing", d / "afile", d / "prompts.txt", d / "new-out", d / "damaged"):
        shutil.rmtree(p) if p.is_dir() and not p.is_symlink() else p.unlink(missing_ok=True)
    (d / "existing").mkdir()
    (d / "existing" / "keep.txt").write_text("an earlier export\n")
    (d / "afile").write_text("not a folder\n")
    (d / "prompts.txt").write_text("the cat sees\n")
    world["data"].write_bytes(world["data_bytes"])
    for p in (world["run"] / "eval.json", world["run"] / "eval", world["run"] / "export"):
        shutil.rmtree(p) if p.is_dir() else p.unlink(missing_ok=True)


def _snapshot(d: Path) -> dict:
    return {str(p.relative_to(d)): p.read_bytes() if p.is_file() else None for p in sorted(d.rglob("*"))
            if not p.is_fifo()}


def _call(main, argv) -> tuple[int, str]:
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            code = main(argv)
        except SystemExit as exc:  # argparse's usage errors: exit 2 and its usage lines
            code = exc.code
    return code, err.getvalue()


def _assert_clean(code, err, prog, before, world):
    assert code in (0, 1, 2), (code, err)
    assert "Traceback" not in err and "internal error" not in err, err
    if code != 0:
        if "usage:" not in err:
            lines = [ln for ln in err.splitlines() if ln.startswith(f"{prog}: error:")]
            assert len(lines) == 1 and err.rstrip().endswith(lines[0]), err
        assert _snapshot(world["dir"]) == before, err
    assert not [p for p in world["dir"].rglob("*") if p.name.endswith(".tmp") or ".partial" in p.name
                and "checkpoints" not in str(p)], err


PATHS = st.sampled_from(["{dir}/existing", "{dir}/afile", "{dir}/afile/x", "{dir}/nope/x", "{dir}/new-out",
                         "{dir}/fifo.jsonl", "{dir}/d.jsonl", "{dir}/prompts.txt", "", "a\x00b",
                         "{dir}/" + "x" * 300, "{run}", "{run}/checkpoints", "{dir}/" + "y/" * 2100])
QUANTS = st.sampled_from(["f16", "q8_0", "F16,q4_k_m", "", ",", "q9", "f16,f16"])


@st.composite
def export_args(draw):
    argv = ["--run", draw(st.sampled_from(["{run}", "{dir}/nope", "{dir}/afile", "{dir}", "a\x00b"]))]
    argv += ["--to", draw(st.sampled_from(["merged", "merged", "gguf", "onnx"]))]
    for flag, values in (("--out", PATHS), ("--dtype", st.sampled_from(["fp32", "bf16", "int4"])),
                         ("--quant", QUANTS), ("--llama-cpp", PATHS)):
        if draw(st.booleans()):
            argv += [flag, draw(values)]
    for flag in ("--overwrite", "--ollama", "--json"):
        if draw(st.booleans()):
            argv.append(flag)
    return argv


@st.composite
def evaluate_args(draw):
    argv = ["--run", draw(st.sampled_from(["{run}", "{run}", "{dir}/nope", "{dir}/afile"])), "--runtime",
            draw(st.sampled_from(["hf", "hf", "llama", "onnx"]))]
    for flag, values in (("--data", PATHS), ("--out", PATHS), ("--prompts", PATHS),
                         ("--ctx", st.sampled_from(["0", "-1", "8", "16", "x", "99999999999"])),
                         ("--max-new-tokens", st.sampled_from(["0", "-3", "2", "nan"])), ("--quant", QUANTS)):
        if draw(st.booleans()):
            argv += [flag, draw(values)]
    return argv


def _fill(argv, world, run):
    return [a.format(dir=world["dir"], run=run) for a in argv]


DAMAGE = st.tuples(
    st.sampled_from(["adapter_model.safetensors", "adapter_config.json", "config.resolved.yaml", "tokenizer.json",
                     "tokenizer_config.json", "summary.json", "checkpoints/checkpoint-2/adapter_model.safetensors",
                     None]),
    st.sampled_from(["truncate", "garbage", "empty", "delete", "list", "fifo"]),
    st.integers(0, 4000))


def _damaged_run(world, damage) -> Path:
    name, how, cut = damage
    run = world["dir"] / "damaged"
    shutil.rmtree(run, ignore_errors=True)
    shutil.copytree(world["run"], run)
    if name is None:
        return run
    f = run / name
    if how == "truncate":
        f.write_bytes(f.read_bytes()[:cut])
    elif how == "garbage":
        f.write_bytes(b"\x00\xffgarbage{" * (cut % 7))
    elif how == "empty":
        f.write_bytes(b"")
    elif how == "delete":
        f.unlink()
    elif how == "list":
        f.write_text("[1, 2, 3]\n")
    elif how == "fifo":
        f.unlink()
        os.mkfifo(f)
    return run


@FUZZ
@given(argv=export_args(), damage=DAMAGE)
def test_fuzz_export_model(world, argv, damage):
    _reset(world)
    run = _damaged_run(world, damage)
    before = _snapshot(world["dir"])
    code, err = _call(export.main, _fill(argv, world, run))
    _assert_clean(code, err, "export-model", before, world)


@FUZZ
@given(argv=evaluate_args(), damage=DAMAGE)
def test_fuzz_evaluate(world, argv, damage):
    _reset(world)
    run = _damaged_run(world, damage)
    before = _snapshot(world["dir"])
    code, err = _call(evaluate.main, _fill(argv, world, run))
    _assert_clean(code, err, "evaluate", before, world)
