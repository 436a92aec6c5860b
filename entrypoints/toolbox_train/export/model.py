"""`export-model --run RUN --to merged|gguf [--quant f16,q8_0,q4_k_m] [--ollama] [--out DIR] [--overwrite]`.

merged: 16-bit safetensors + tokenizer + chat template. A LoRA adapter is merged into its base;
a QLoRA adapter into the base's 16-bit weights (the base is loaded unquantized, never 4-bit).
gguf:   the merged model converted once by llama.cpp's convert_hf_to_gguf.py (f16, bf16 or f32),
        then quantized by llama-quantize into each other type; --ollama writes a Modelfile.
Everything is checked before any work (exit 2); the result is written into a temporary folder
beside the output and renamed into place, so a failure leaves nothing half-written.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
import dataclasses
from dataclasses import dataclass, field
from pathlib import Path

from toolbox_train.export import card, llamacpp, projector
from toolbox_train.contract import ToolError, UserError, command_parser, run_command
from toolbox_train.disk import publish_folder
from toolbox_train.guards import check_path
from toolbox_train.runs.folder import RunModel, find_finished, loading
from toolbox_train.sizes import human_size

DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}
STAGING_DTYPE = {"f16": "fp16", "bf16": "bf16", "f32": "fp32"}  # lossless into the GGUF type


# Not `export`: that is a shell builtin, so a console script of that name never runs from a shell.
PROG = "export-model"


def say(msg: str) -> None:
    print(f"{PROG}: {msg}", file=sys.stderr, flush=True)


@dataclass
class Job:
    rm: RunModel
    to: str
    out: Path
    quants: list[str]
    dtype: str
    ollama: bool
    overwrite: bool
    tools: llamacpp.Tools | None
    estimate: int = 0
    projector: bool = False  # gguf: the vision projector too (mmproj-<type>.gguf)
    notes: list[str] = field(default_factory=list)


def conversion_type(quants: list[str]) -> str:
    """The one type the converter writes; every other type is quantized from it."""
    for t in ("f16", "bf16", "f32"):
        if t in quants:
            return t
    return "f16"


def estimate_bytes(rm: RunModel, to: str, quants: list[str], dtype: str) -> int:
    n = rm.param_count()
    if to == "merged":
        return int(n * (4 if dtype == "fp32" else 2) * 1.02) + (16 << 20)
    conv = conversion_type(quants)
    staged = 0 if rm.kind == "full" else n * llamacpp.QUANT_BYTES[conv]  # merged copy, removed at the end
    total = staged + n * llamacpp.QUANT_BYTES[conv]  # the converted GGUF (kept or not, it exists meanwhile)
    total += sum(n * llamacpp.QUANT_BYTES[q] for q in quants if q != conv)
    return int(total * 1.05) + (16 << 20)  # metadata, vocab, tokenizer files


def free_bytes(path: Path) -> int:
    p = path
    while not p.exists():
        p = p.parent
    return shutil.disk_usage(p).free


def check(args) -> Job:
    rm = find_finished(Path(args.run))
    to = args.to
    quants = llamacpp.parse_quants(args.quant) if to == "gguf" else []
    if to != "gguf" and args.quant:
        raise UserError("--quant: only with --to gguf")
    if args.ollama and to != "gguf":
        raise UserError("--ollama: only with --to gguf (Ollama runs GGUF files)")
    out = check_path(args.out, "--out") if args.out is not None else rm.run / "export" / to
    out = out.expanduser().absolute()
    if args.out is not None:  # a folder of the user's: its parent must be there (nothing is created around it)
        if not out.parent.is_dir():
            raise UserError(f"--out {out}: no folder {out.parent}" + (
                " (a file)" if out.parent.exists() else "; create it first"))
        if not os.access(out.parent, os.W_OK):
            raise UserError(f"--out {out}: folder {out.parent} is not writable")
    out = out.resolve()
    if out.exists() and not out.is_dir():
        raise UserError(f"--out {out}: exists and is not a folder")
    if out.exists() and not args.overwrite:
        raise UserError(f"--out {out}: exists; pass --overwrite to replace it")
    if out == rm.run or rm.run.is_relative_to(out):
        raise UserError(f"--out {out}: would replace the run folder itself")
    dtype = args.dtype or rm.default_dtype()
    if args.llama_cpp is not None:
        check_path(args.llama_cpp, "--llama-cpp")
    tools = llamacpp.find_tools(args.llama_cpp) if to == "gguf" else None
    if tools is not None:
        tools.logs = rm.run / llamacpp.LOGS  # the tools' own output: named by a failure's line, never on our stderr
    job = Job(rm, to, out, quants, dtype, args.ollama, args.overwrite, tools)
    job.estimate = estimate_bytes(rm, to, quants, dtype)
    free = free_bytes(out.parent)
    if job.estimate > free:
        raise UserError(f"--out {out}: too little disk: the export needs about {human_size(job.estimate)}, "
                        f"{human_size(free)} free there")
    job.notes += rm.export_notes(to)
    if tools is not None and (rm.vision or rm.multimodal):
        arch = rm.architecture()
        job.projector = arch in llamacpp.projector_architectures(tools)
        job.notes.append(
            f"GGUF: the language model and its vision projector (mmproj-{conversion_type(quants)}.gguf, not quantized; "
            "llama-mtmd-cli and llama-server take it with --mmproj)" if job.projector else
            f"GGUF: llama.cpp {tools.version()}'s converter writes no vision projector for {arch}: the GGUF holds "
            "the language model only (images need the merged export)")
    return job


# ---------------------------------------------------------------- work


def merge(rm: RunModel, dest: Path, dtype: str) -> None:
    """Write the 16-bit (or fp32) model with tokenizer and chat template into `dest`."""
    import torch
    import transformers

    # An image-text model (a vision run, or a multimodal checkpoint trained on text) keeps its tower.
    auto = transformers.AutoModelForImageTextToText if rm.vision or rm.multimodal else transformers.AutoModelForCausalLM
    td = getattr(torch, DTYPES[dtype])
    t0 = time.perf_counter()
    if rm.kind == "full":
        say(f"loading {rm.run} ({dtype})")
        with loading(f"--run {rm.run}: the model"):
            model = auto.from_pretrained(rm.run, dtype=td)
    else:
        from peft import PeftModel

        # The base in 16 bits (or fp32) from its own weights, never the 4-bit copy QLoRA trained on.
        say(f"loading base {rm.base} ({dtype}) and adapter {rm.run}")
        with loading(f"base model {rm.base}"):
            base = auto.from_pretrained(rm.base, dtype=td, quantization_config=None)
        with loading(f"--run {rm.run}: the adapter"):
            model = PeftModel.from_pretrained(base, str(rm.run)).merge_and_unload()
    model = model.to(td)
    if getattr(model.config, "quantization_config", None) is not None:
        del model.config.quantization_config  # a merged export is plain weights
    model.save_pretrained(dest, safe_serialization=True)
    # A vision run saved its processor (tokenizer, image processor, chat template): the export carries it.
    with loading(f"--run {rm.run}: the {'processor' if rm.vision else 'tokenizer'}"):
        tok = (transformers.AutoProcessor if rm.vision else transformers.AutoTokenizer).from_pretrained(rm.run)
    tok.save_pretrained(dest)
    say(f"merged in {time.perf_counter() - t0:.1f} s")


def _wrote(path: Path, manifest: list[dict]) -> None:
    size = sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) if path.is_dir() else path.stat().st_size
    manifest.append({"path": path.name, "bytes": size})
    say(f"wrote {path.name} ({human_size(size)})")


def do_merged(job: Job, tmp: Path, manifest: list[dict]) -> None:
    merge(job.rm, tmp, job.dtype)
    for f in sorted(tmp.iterdir()):
        _wrote(f, manifest)


def do_gguf(job: Job, tmp: Path, manifest: list[dict]) -> None:
    conv = conversion_type(job.quants)
    if job.rm.kind == "full":
        src = job.rm.run
    else:
        src = tmp / ".merged"
        say(f"step 1: merge the adapter into its base ({STAGING_DTYPE[conv]}, temporary)")
        merge(job.rm, src, STAGING_DTYPE[conv])
    say(f"step 2: convert to GGUF {conv} with {job.tools.converter} (its output: {job.tools.log(f'convert-{conv}')})")
    conv_file = tmp / f"model-{conv}.gguf"
    llamacpp.convert(job.tools, src, conv_file, conv)
    if conv in job.quants:
        _wrote(conv_file, manifest)
    if job.projector:
        say(f"step 2b: the vision projector ({conv}) with --mmproj (its output: {job.tools.log(f'convert-mmproj-{conv}')})")
        vsrc = projector.source(src, tmp / ".mmproj-source")
        llamacpp.convert(job.tools, vsrc, tmp / f"mmproj-{conv}.gguf", conv, mmproj=True)
        if vsrc != src:
            shutil.rmtree(vsrc)
        _wrote(tmp / f"mmproj-{conv}.gguf", manifest)
    rest = [q for q in job.quants if q != conv]
    for i, q in enumerate(rest, 1):
        say(f"step 3.{i}/{len(rest)}: llama-quantize {conv} -> {q}")
        dst = tmp / f"model-{q}.gguf"
        llamacpp.quantize(job.tools, conv_file, dst, q)
        _wrote(dst, manifest)
    if conv not in job.quants:
        conv_file.unlink()
    if src != job.rm.run:
        shutil.rmtree(src)
    if job.ollama:
        ggufs = sorted(tmp.glob("model-*.gguf"), key=lambda f: f.stat().st_size)
        target = ggufs[0]  # the smallest: what a laptop runs
        (tmp / "Modelfile").write_text(
            "# Written by `toolbox export`; `ollama create NAME -f Modelfile` in this folder.\n"
            "# Ollama reads the chat template from the GGUF's tokenizer.chat_template.\n"
            + (f"# The vision projector is mmproj-{conv}.gguf beside it (llama.cpp: --mmproj).\n" if job.projector else "")
            + f"FROM ./{target.name}\n")
        _wrote(tmp / "Modelfile", manifest)


def execute(job: Job) -> dict:
    """Build the export in a temp folder beside --out and rename it into place when whole; on any
    failure (a tool, a full disk, SIGTERM) the temp folder, and any folder made for it, go."""
    made = [p for p in (job.out.parent, job.out.parent.parent) if not p.exists()]  # RUN/export (default out)
    try:
        job.out.parent.mkdir(parents=True, exist_ok=True)
        return _execute(job)
    except OSError as exc:  # ENOSPC, EDQUOT, EACCES while writing
        raise ToolError(f"--out {job.out}: {exc.strerror or exc} while writing the export; nothing was "
                        "written") from None
    finally:
        if not job.out.exists():
            for p in made:
                shutil.rmtree(p, ignore_errors=True)


def _execute(job: Job) -> dict:
    with publish_folder(job.out) as tmp:
        manifest: list[dict] = []
        t0 = time.perf_counter()
        (do_merged if job.to == "merged" else do_gguf)(job, tmp, manifest)
        _wrote(card.write(job.rm.run, job.rm.resolved, tmp, job.to,
                          [f["path"] for f in manifest if f["path"].endswith(".gguf")]), manifest)
        result = {"run": str(job.rm.run), "to": job.to, "out": str(job.out), "kind": job.rm.kind,
                  "method": job.rm.method, "base": job.rm.base, "dtype": job.dtype if job.to == "merged" else None,
                  "quants": job.quants, "files": manifest, "notes": job.notes,
                  "llama_cpp": job.tools.version() if job.tools else None,
                  "seconds": round(time.perf_counter() - t0, 2)}
        (tmp / "export.json").write_text(json.dumps(result, indent=2) + "\n")
    return result


def build_parser() -> argparse.ArgumentParser:
    ap = command_parser(PROG, "Export a finished finetune run: merged 16-bit safetensors, or GGUF files for "
                        "llama.cpp / Ollama / LM Studio.")
    ap.add_argument("--run", required=True, help="the finetune output folder")
    ap.add_argument("--to", required=True, choices=["merged", "gguf"])
    ap.add_argument("--quant", default=None, help="GGUF types, comma-separated (default f16), e.g. f16,q8_0,q4_k_m")
    ap.add_argument("--ollama", action="store_true", help="write an Ollama Modelfile beside the GGUF")
    ap.add_argument("--out", help="output folder (default RUN/export/merged or RUN/export/gguf)")
    ap.add_argument("--dtype", choices=list(DTYPES), help="merged weights (default: the base's 16-bit type, else bf16)")
    ap.add_argument("--overwrite", action="store_true", help="replace an existing output folder")
    ap.add_argument("--llama-cpp", help=f"llama.cpp folder (bin/, convert_hf_to_gguf.py); default "
                    f"$LLAMA_CPP_DIR or {llamacpp.DEFAULT_DIR}")
    ap.add_argument("--json", action="store_true", help="print the result as JSON on stdout")
    return ap


@dataclass(frozen=True)
class Request:
    """What to export (the command line's flags, or finetune's `output.export` items as they are typed)."""
    run: str
    to: str
    quant: str | None = None  # gguf: comma-separated types (None: f16)
    ollama: bool = False
    out: str | None = None
    dtype: str | None = None
    overwrite: bool = False
    llama_cpp: str | None = None


def run(argv: list[str]) -> dict:
    args = build_parser().parse_args(argv)
    return export(Request(args.run, args.to, args.quant, args.ollama, args.out, args.dtype, args.overwrite,
                          args.llama_cpp))


def export(req: Request) -> dict:
    """One export of a finished run: checked (nothing written on bad input), then done."""
    if req.to == "gguf" and req.quant is None:
        req = dataclasses.replace(req, quant="f16")
    job = check(req)
    for n in job.notes:
        say(f"note: {n}")
    say(f"{job.rm.describe()} -> {job.to} in {job.out} (about {human_size(job.estimate)} of disk)")
    return execute(job)


def main(argv: list[str] | None = None) -> int:
    # A partial result is never left: execute() writes into a temporary folder and renames it.
    return run_command(PROG, _main, argv, interrupted="interrupted (nothing written)")


def _main(argv: list[str]) -> int:
    result = run(argv)
    if "--json" in argv:
        print(json.dumps(result))
    else:
        total = sum(f["bytes"] for f in result["files"])
        print(f"{PROG}: done in {result['seconds']} s: {result['out']} ({human_size(total)})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
