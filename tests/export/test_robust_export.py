"""export-model and evaluate under bad input and faults (issue 23): one line naming the flag or
file, exit 2 for input and 1 for a fault, no traceback, and whatever was there left exactly as it
was (no half-written output, no temp files, not even on a full disk).

The llama.cpp failure paths use a stand-in tools folder (scripts that fail as a tool does); the
real tools' success paths are tests/export/test_gguf.py's."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from exportkit import finetune_run
from helpers.tiny import write_dataset
from toolbox_train.export import evaluate, model as export

ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONPATH": f"{ROOT / 'entrypoints'}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}


@pytest.fixture(scope="module")
def lora_run(tiny_model, tmp_path_factory):
    return finetune_run(tiny_model, tmp_path_factory.mktemp("robust") / "run", steps=2,
                        **{"data.eval_split": 0.25})


@pytest.fixture
def run(lora_run, tmp_path):
    d = tmp_path / "run"
    shutil.copytree(lora_run, d)
    return d


def _snapshot(d: Path) -> dict:
    return {str(p.relative_to(d)): p.read_bytes() if p.is_file() else None for p in sorted(d.rglob("*"))}


def _call(main, argv, capsys) -> tuple[int, str]:
    code = main([str(a) for a in argv])
    err = capsys.readouterr().err
    assert "Traceback" not in err, err
    return code, err


def _one_line(err: str, prog: str) -> str:
    lines = [ln for ln in err.splitlines() if ln.startswith(f"{prog}: error:")]
    assert len(lines) == 1 and err.rstrip().endswith(lines[0]), err
    return lines[0]


@pytest.mark.parametrize("suffix", ["jsonl", "csv", "parquet"])
def test_evaluate_data_file(run, tmp_path, capsys, suffix):
    data = write_dataset(tmp_path / f"held.{suffix}", "text", n=40, seed=7)
    code, err = _call(evaluate.main, ["--run", run, "--runtime", "hf", "--data", data, "--ctx", "16"], capsys)
    assert code == 0, err
    r = json.loads((run / "eval.json").read_text())
    assert r["data"] == str(data) and r["base"]["ppl"] > 0 and r["finetuned"]["ppl"] > 0


@pytest.mark.parametrize("name", ["adapter_model.safetensors", "adapter_config.json", "config.resolved.yaml",
                                  "tokenizer.json", "summary.json"])
@pytest.mark.parametrize("how", ["truncate", "list"])
@pytest.mark.parametrize("prog", ["export-model", "evaluate"])
def test_a_damaged_run_file_is_named(run, tmp_path, capsys, name, how, prog):
    f = run / name
    f.write_bytes(f.read_bytes()[: f.stat().st_size // 2] if how == "truncate" else b"[1, 2]\n")
    before = _snapshot(tmp_path)
    if prog == "export-model":
        code, err = _call(export.main, ["--run", run, "--to", "merged", "--out", tmp_path / "out"], capsys)
    else:
        code, err = _call(evaluate.main, ["--run", run, "--runtime", "hf"], capsys)
    assert code == 2, err
    assert str(f) in _one_line(err, prog)
    assert _snapshot(tmp_path) == before


def test_a_fifo_in_the_run_or_as_data_is_refused_not_read(run, lora_run, tmp_path, capsys):
    fifo = tmp_path / "held.jsonl"
    os.mkfifo(fifo)
    for flag in ("--data", "--prompts"):
        code, err = _call(evaluate.main, ["--run", run, "--runtime", "hf", flag, fifo], capsys)
        assert code == 2 and f"{flag} {fifo}: a FIFO (named pipe), not a regular file" in _one_line(err, "evaluate")
    (run / "tokenizer.json").unlink()
    os.mkfifo(run / "tokenizer.json")
    code, err = _call(export.main, ["--run", run, "--to", "merged", "--out", tmp_path / "o"], capsys)
    assert code == 2 and "tokenizer.json: a FIFO" in _one_line(err, "export-model")
    (run / "tokenizer.json").unlink()
    shutil.copy(lora_run / "tokenizer.json", run / "tokenizer.json")
    (run / "chat_template.jinja").unlink()
    os.mkfifo(run / "chat_template.jinja")  # read by the tokenizer's loader, named by no check
    code, err = _call(evaluate.main, ["--run", run, "--runtime", "hf"], capsys)
    assert code == 2 and "chat_template.jinja: a FIFO" in _one_line(err, "evaluate")


@pytest.mark.parametrize("out, expect", [
    ("nope/deeper/x", "no folder {t}/nope/deeper; create it first"),
    ("afile/x", "no folder {t}/afile (a file)"),
    ("afile", "exists and is not a folder"),
    ("existing", "exists; pass --overwrite to replace it"),
    ("x" * 300, "the OS limit is 255"),
    ("", "empty (it would name the current folder)"),
])
def test_export_out_refusals_change_nothing(run, tmp_path, capsys, out, expect):
    (tmp_path / "afile").write_text("mine\n")
    (tmp_path / "existing").mkdir()
    (tmp_path / "existing" / "keep.txt").write_text("an earlier export\n")
    before = _snapshot(tmp_path)
    target = str(tmp_path / out) if out else ""
    code, err = _call(export.main, ["--run", run, "--to", "merged", "--out", target], capsys)
    assert code == 2 and expect.format(t=tmp_path) in _one_line(err, "export-model"), err
    assert _snapshot(tmp_path) == before


@pytest.mark.parametrize("out, expect", [
    ("nope/x.json", "no folder {t}/nope"),
    ("existing", "a folder; give a file name"),
])
def test_evaluate_out_refusals_change_nothing(run, tmp_path, capsys, out, expect):
    (tmp_path / "existing").mkdir()
    before = _snapshot(tmp_path)
    code, err = _call(evaluate.main, ["--run", run, "--runtime", "hf", "--out", tmp_path / out], capsys)
    assert code == 2 and expect.format(t=tmp_path) in _one_line(err, "evaluate"), err
    assert _snapshot(tmp_path) == before


def _tools(d: Path, converter: str) -> Path:
    """A llama.cpp-shaped folder whose programs fail the way a broken tool does."""
    (d / "bin").mkdir(parents=True)
    (d / "convert_hf_to_gguf.py").write_text(converter)
    for name in ("llama-quantize", "llama-perplexity", "llama-completion"):
        (d / "bin" / name).write_text("#!/bin/sh\necho 'stand-in tool, never run here' >&2\nexit 9\n")
        (d / "bin" / name).chmod(0o755)
    return d


def test_a_failed_converter_is_one_line_and_leaves_the_old_export(run, tmp_path, capsys):
    noisy = "import sys\nfor i in range(40):\n    print('converter noise', i, file=sys.stderr)\nsys.exit(3)\n"
    tools = _tools(tmp_path / "tools", noisy)
    out = tmp_path / "exports" / "gguf"
    out.mkdir(parents=True)
    (out / "model-f16.gguf").write_bytes(b"GGUF\x03\x00\x00\x00an earlier export")
    before = _snapshot(tmp_path / "exports")
    code, err = _call(export.main, ["--run", run, "--to", "gguf", "--out", out, "--overwrite", "--llama-cpp", tools],
                      capsys)
    assert code == 1
    assert _one_line(err, "export-model").endswith("convert_hf_to_gguf.py (f16) failed (exit 3): converter noise 39")
    # The converter's output is in the log the line names (RUN/logs), not on our stderr.
    log = run / "logs" / "convert-f16.log"
    assert _one_line(err, "export-model") == f"export-model: error: {log}: convert_hf_to_gguf.py (f16) failed (exit 3): converter noise 39"
    assert "converter noise 0\n" not in err and log.read_text().count("converter noise") == 40
    assert _snapshot(tmp_path / "exports") == before  # the old export as it was, no temp folder beside it
    # The default output folder (RUN/export/gguf): nothing of it is left after a failure.
    code, err = _call(export.main, ["--run", run, "--to", "gguf", "--llama-cpp", tools], capsys)
    assert code == 1 and not (run / "export").exists()


def test_evaluate_refuses_a_file_that_is_not_gguf(run, tmp_path, capsys):
    tools = _tools(tmp_path / "tools", "raise SystemExit(1)\n")
    f = run / "export" / "gguf" / "model-f16.gguf"
    f.parent.mkdir(parents=True)
    f.write_text("<html>not a model</html>\n")
    before = _snapshot(run)
    code, err = _call(evaluate.main, ["--run", run, "--llama-cpp", tools], capsys)
    assert code == 2 and f"{f}: not a GGUF file (no GGUF magic)" in _one_line(err, "evaluate"), err
    assert _snapshot(run) == before


def _mount_cmd() -> list[str] | None:
    """A private mount namespace to mount a small tmpfs in: root's own, or a user namespace."""
    for cmd in (["unshare", "--mount"], ["unshare", "--mount", "--map-root-user"]):
        if shutil.which("unshare") and subprocess.run(cmd + ["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs",
                                                             "/mnt"], capture_output=True).returncode == 0:
            return cmd
    return None


def test_a_full_disk_leaves_no_temp_file(run, tmp_path):
    cmd = _mount_cmd()
    if cmd is None:
        pytest.skip("no mount namespace here (needs root or unprivileged user namespaces) to fill a tmpfs")
    disk = tmp_path / "disk"
    disk.mkdir()
    script = (f"mount -t tmpfs -o size=64k tmpfs {disk} && (head -c 1M /dev/zero > {disk}/fill; true) && "
              f"{sys.executable} -m toolbox_train.export.evaluate --run {run} --runtime hf --out {disk}/eval.json; "
              f"echo rc=$?; ls -A {disk}")
    r = subprocess.run(cmd + ["sh", "-c", script], env=ENV, capture_output=True, text=True, timeout=600)
    assert "rc=1" in r.stdout, (r.stdout, r.stderr)
    assert r.stdout.split("rc=1", 1)[1].split() == ["fill"]  # no .eval.json.*.tmp left behind
    last = r.stderr.strip().splitlines()[-1]
    assert last == f"evaluate: error: {disk}/eval.json: cannot write: No space left on device; nothing was changed"
    assert "Traceback" not in r.stderr


def test_sigterm_during_an_export_leaves_the_old_one(run, tmp_path):
    # The stand-in converter sends SIGTERM to export-model (as podman stop would) and waits to be killed.
    tools = _tools(tmp_path / "tools", "import os, signal, time\nos.kill(os.getppid(), signal.SIGTERM)\n"
                                       "time.sleep(120)\n")
    out = tmp_path / "exports" / "gguf"
    out.mkdir(parents=True)
    (out / "model-f16.gguf").write_bytes(b"GGUF\x03\x00\x00\x00an earlier export")
    before = _snapshot(tmp_path / "exports")
    r = subprocess.run([sys.executable, "-m", "toolbox_train.export.model", "--run", str(run), "--to", "gguf",
                        "--out", str(out), "--overwrite", "--llama-cpp", str(tools)],
                       env=ENV, capture_output=True, text=True, timeout=300)
    assert r.returncode == 143, r.stderr
    assert r.stderr.strip().splitlines()[-1] == "export-model: terminated (SIGTERM)" and "Traceback" not in r.stderr
    assert _snapshot(tmp_path / "exports") == before  # no partial folder, the old export as it was


def test_a_full_disk_during_the_conversion_names_it_and_logs_the_converter(real_vocab_model, llama_source, tmp_path):
    """What `evaluate --runtime llama` and `export-model --to gguf` run, on a run folder with little
    room left: llama.cpp's real converter (nothing built) fills the disk; the line says so and names
    the log that holds the converter's own traceback."""
    from helpers.mounts import tmpfs

    from toolbox_train.contract import ToolError
    from toolbox_train.export import llamacpp

    tools = llamacpp.Tools(tmp_path / "tools")
    tools.root.mkdir()
    for name in ("convert_hf_to_gguf.py", "conversion", "gguf-py"):
        (tools.root / name).symlink_to(llama_source / name)
    model = real_vocab_model("llama")
    with tmpfs(tmp_path / "disk", "2m") as disk:  # the base's f16 GGUF is ~16 MiB
        tools.logs = disk / "run" / llamacpp.LOGS
        staged = disk / "run" / "eval" / ".base-f16.partial-1"
        staged.mkdir(parents=True)
        with pytest.raises(ToolError) as e:
            llamacpp.convert(tools, model, staged / "model-f16.gguf", "f16")
        line = str(e.value)
        assert "\n" not in line and line.startswith(
            f"convert_hf_to_gguf.py (f16): disk full at {disk / 'run' / 'eval'} (No space left on device"), line
        log = Path(line.rsplit("; its output: ", 1)[1])
        text = log.read_text()
        assert "Traceback" in text and "No space left on device" in text, text[-2000:]
        # The log could not be written on the full disk: none half-written there, the whole tail elsewhere.
        assert not (tools.logs / "convert-f16.log").exists() or log == tools.logs / "convert-f16.log"
        log.unlink()
