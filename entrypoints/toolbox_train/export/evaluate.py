"""`evaluate --run RUN [--data FILE] [--runtime llama|hf] [--prompts FILE]`.

Perplexity of the base model and of the fine-tuned one on held-out text, side by side, written
to RUN/eval.json. The default runtime runs llama.cpp's llama-perplexity on GGUF files in a
separate process (an in-process HF eval of a large model can exhaust a unified-memory APU);
`--runtime hf` (transformers) computes the same quantity in-process: the text cut into chunks of --ctx tokens
(BOS first where the vocabulary adds one), each chunk's second half scored, as llama-perplexity does.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import sys
import tempfile
from pathlib import Path

from toolbox_train.export import llamacpp
from toolbox_train.contract import ToolError, UserError, command_parser, renamed, run_command
from toolbox_train.disk import atomic_write, publish_folder
from toolbox_train.guards import check_path, regular_file
from toolbox_train.runs.folder import RunModel, find_finished, hf_model, loading, rows_to_texts


def say(msg: str) -> None:
    print(f"evaluate: {msg}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------- held-out text


def load_texts(rm: RunModel, data: str | None, tok) -> list[str]:
    if data is None:
        return rm.eval_texts(tok)
    path = regular_file(data, "--data")
    if path.suffix.lower() == ".txt":
        return [path.read_text(errors="replace")]
    from toolbox_train.data.dataset import load_raw, shape

    # finetune's loader: every row checked against its format (text, alpaca or messages).
    ds, fmt, _ = load_raw(str(path.resolve()), "train", Path.cwd(), "--data", "auto", "text")
    return rows_to_texts(shape(ds, fmt, "text", str(path)), tok)


def add_bos(tok) -> bool:
    ids = tok("a")["input_ids"]
    return tok.bos_token_id is not None and bool(ids) and ids[0] == tok.bos_token_id


def hf_perplexity(model, ids: list[int], ctx: int, bos: int | None) -> dict:
    """llama-perplexity's computation on an HF model (see the module docstring)."""
    import torch

    first = ctx // 2
    n_chunk = len(ids) // ctx
    nll, count = 0.0, 0
    with torch.no_grad():
        for i in range(n_chunk):
            chunk = list(ids[i * ctx:(i + 1) * ctx])
            if bos is not None:
                chunk[0] = bos
            logits = model(torch.tensor([chunk], device=model.device)).logits[0].float()
            lp = torch.log_softmax(logits[first:ctx - 1], dim=-1)
            tgt = torch.tensor(chunk[first + 1:ctx], device=lp.device)
            nll -= lp.gather(1, tgt[:, None]).sum().item()
            count += ctx - 1 - first
    return {"ppl": math.exp(nll / count), "ctx": ctx, "chunks": n_chunk, "scored_tokens": count}


# ---------------------------------------------------------------- models per runtime


def _gguf_for(rm: RunModel, quant: str, tools, which: str) -> Path:
    """The GGUF of the fine-tuned (`export`'s, made if missing) or of the base model (cached in RUN/eval)."""
    from toolbox_train.export import model as export_model

    if which == "finetuned":
        have = rm.run / "export" / "gguf" / f"model-{quant}.gguf"
        if have.exists():
            return _gguf(have, f"re-export it: export-model --run {rm.run} --to gguf --quant {quant} --overwrite")
        out = rm.run / "eval" / f"finetuned-{quant}"
        argv = ["--run", str(rm.run), "--to", "gguf", "--quant", quant, "--out", str(out), "--llama-cpp", str(tools.root)]
    else:
        out = rm.run / "eval" / f"base-{quant}"
        base = rm.resolved["model"]["path"]
        if not (Path(base) / "config.json").is_file():
            raise UserError(f"base model {base}: not a local folder here (needed to convert it to GGUF)")
        argv = None
    f = out / f"model-{quant}.gguf"
    if f.is_file() and gguf_problem(f) is None:
        return f
    shutil.rmtree(out, ignore_errors=True)  # our own cache, damaged: made again
    if argv is not None:
        out.parent.mkdir(exist_ok=True)  # RUN/eval: export-model wants --out's folder to exist
        export_model.execute(export_model.check(export_model.build_parser().parse_args(argv)))
        return f
    # The base: convert (and quantize) straight from its folder, atomically like export.
    conv = export_model.conversion_type([quant])
    with publish_folder(out) as tmp:
        say(f"converting the base model {base} to GGUF {conv} (its output: {tools.log(f'convert-{conv}')})")
        llamacpp.convert(tools, Path(base), tmp / f"model-{conv}.gguf", conv)
        if quant != conv:
            llamacpp.quantize(tools, tmp / f"model-{conv}.gguf", tmp / f"model-{quant}.gguf", quant)
            (tmp / f"model-{conv}.gguf").unlink()
    return f


def gguf_problem(f: Path) -> str | None:
    """Why `f` is not a GGUF file llama.cpp could load (its magic and version), or None."""
    try:
        with regular_file(f, "GGUF").open("rb") as fh:
            head = fh.read(8)
    except OSError as exc:
        return f"cannot be read ({exc.strerror})"
    if head[:4] != b"GGUF":
        return "not a GGUF file (no GGUF magic)"
    if len(head) < 8 or int.from_bytes(head[4:8], "little") not in (2, 3):
        return "truncated or corrupt GGUF header"
    return None


def _gguf(f: Path, fix: str) -> Path:
    why = gguf_problem(f)
    if why:
        raise UserError(f"{f}: {why}; {fix}")
    return f


def _hf_generate(model, tok, prompt: str, n: int) -> str:
    import torch

    enc = tok(prompt, return_tensors="pt").to(model.device)  # the model may be on the GPU (scoring_device)
    with torch.no_grad():
        out = model.generate(**enc, max_new_tokens=n, do_sample=False, pad_token_id=tok.pad_token_id or tok.eos_token_id)
    return tok.decode(out[0, enc["input_ids"].shape[1]:], skip_special_tokens=True)


# ---------------------------------------------------------------- command


def build_parser() -> argparse.ArgumentParser:
    ap = command_parser("evaluate", "Perplexity (and greedy completions) of the base and the fine-tuned "
                        "model, side by side.")
    ap.add_argument("--run", required=True, help="the finetune output folder")
    ap.add_argument("--data", help="held-out text: .txt, or a dataset file like finetune's (default: the run's eval split)")
    ap.add_argument("--runtime", choices=["llama", "hf"], default=None,
                    help="what computes the perplexity: llama: llama.cpp's llama-perplexity on GGUF in a separate "
                    "process (default); hf: transformers, in-process (the default and only one for a vision run: "
                    "its answers on held-out image rows)")
    renamed(ap, "--backend", "--runtime")  # `backend` is finetune's HF/Unsloth
    ap.add_argument("--quant", default="f16", help="GGUF type evaluated with --runtime llama (default f16)")
    ap.add_argument("--ctx", type=int, default=512, help="tokens per chunk (lowered to fit short text)")
    ap.add_argument("--prompts", help="a file of prompts, one per line: greedy completions of both models")
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--out", help="result file (default RUN/eval.json)")
    ap.add_argument("--llama-cpp", help=f"llama.cpp folder; default $LLAMA_CPP_DIR or {llamacpp.DEFAULT_DIR}")
    ap.add_argument("--json", action="store_true", help="print the result as JSON on stdout")
    return ap


def check(args):
    rm = find_finished(Path(args.run))
    if rm.vision:  # image rows: scored in-process (llama-perplexity reads text only)
        if args.runtime == "llama":
            raise UserError("--runtime llama: llama-perplexity scores text only; a vision run's held-out image rows "
                            "are scored with --runtime hf (its default)")
        if args.prompts is not None:
            raise UserError("--prompts: text prompts for a text model; a vision run is scored on held-out image rows "
                            "(--data FILE of messages + images)")
    args.runtime = args.runtime or ("hf" if rm.vision else "llama")
    if args.runtime == "llama":
        quant = llamacpp.parse_quants(args.quant)
        if len(quant) != 1:
            raise UserError("--quant: one type for evaluate")
        args.quant = quant[0]
        tools = llamacpp.find_tools(args.llama_cpp, need=("llama-quantize", "llama-perplexity", "llama-completion"))
        tools.logs = rm.run / llamacpp.LOGS  # the tools' own output: named by a failure's line, never on our stderr
        have = rm.run / "export" / "gguf" / f"model-{args.quant}.gguf"
        if have.exists():  # export-model's file, used as it is: checked before any conversion
            _gguf(have, f"re-export it: export-model --run {rm.run} --to gguf --quant {args.quant} --overwrite")
    else:
        tools = None
    if args.ctx < 8:
        raise UserError(f"--ctx {args.ctx}: at least 8")
    if args.max_new_tokens < 1:
        raise UserError(f"--max-new-tokens {args.max_new_tokens}: at least 1")
    if args.data is not None:
        regular_file(args.data, "--data")
    prompts = None
    if args.prompts is not None:
        p = regular_file(args.prompts, "--prompts")
        prompts = [ln for ln in p.read_text(errors="replace").splitlines() if ln.strip()]
        if not prompts:
            raise UserError(f"--prompts {p}: no prompts (one per line)")
    args.out = out_file(args.out, rm)
    return rm, tools, prompts


def out_file(flag: str | None, rm: RunModel) -> Path:
    """Where the result goes: a file in an existing folder (nothing is created around it)."""
    if flag is None:
        return rm.run / "eval.json"
    out = check_path(flag, "--out").expanduser().absolute()
    if out.is_dir():
        raise UserError(f"--out {out}: a folder; give a file name (e.g. {out / 'eval.json'})")
    if out.exists() and not out.is_file():
        raise UserError(f"--out {out}: exists and is not a regular file")
    if not out.parent.is_dir():
        raise UserError(f"--out {out}: no folder {out.parent}")
    if not os.access(out.parent, os.W_OK):
        raise UserError(f"--out {out}: folder {out.parent} is not writable")
    return out


def run(argv: list[str]) -> dict:
    from transformers import AutoTokenizer

    args = build_parser().parse_args(argv)
    rm, tools, prompts = check(args)
    if rm.vision:
        return _vision(rm, args)
    with loading(f"--run {rm.run}: the tokenizer"):
        tok = AutoTokenizer.from_pretrained(rm.run)
    text = "\n\n".join(load_texts(rm, args.data, tok))
    ids = tok(text)["input_ids"]
    ctx = min(args.ctx, len(ids) // 2)
    ctx -= ctx % 2
    if ctx < 8:
        raise UserError(f"held-out text: {len(ids)} tokens, too few for perplexity (at least 16)")
    if ctx < args.ctx:
        say(f"held-out text has {len(ids)} tokens: --ctx lowered to {ctx}")
    base_path = rm.resolved["model"]["path"]
    result = {"run": str(rm.run), "runtime": args.runtime, "ctx": ctx, "text_tokens": len(ids),
              "data": args.data or "the run's eval split"}
    completions = []
    if args.runtime == "llama":
        result["quant"] = args.quant
        result["llama_cpp"] = tools.version()
        cache = rm.run / "eval"
        made = not cache.exists()
        try:
            ggufs = {w: _gguf_for(rm, args.quant, tools, w) for w in ("base", "finetuned")}
        except BaseException:
            if made:  # a failed command leaves the run folder as it was
                shutil.rmtree(cache, ignore_errors=True)
            raise
        with tempfile.TemporaryDirectory(prefix="evaluate-") as tmp:  # nothing left in the run folder
            text_file = Path(tmp) / "heldout.txt"
            text_file.write_text(text)
            for w, g in ggufs.items():
                say(f"llama-perplexity on {g}")
                result[w] = {**llamacpp.perplexity(tools, g, text_file, ctx), "model": str(g)}
        for p in prompts or []:
            completions.append({"prompt": p, **{w: llamacpp.complete(tools, g, p, args.max_new_tokens)
                                                for w, g in ggufs.items()}})
    else:
        bos = tok.bos_token_id if add_bos(tok) else None
        for w in ("base", "finetuned"):
            model = hf_model(base_path) if w == "base" else (
                hf_model(rm.base, rm.run) if rm.kind == "adapter" else hf_model(str(rm.run)))
            say(f"HF perplexity of the {w} model")
            result[w] = {**hf_perplexity(model, ids, ctx, bos), "model": base_path if w == "base" else str(rm.run)}
            for i, p in enumerate(prompts or []):
                if w == "base":
                    completions.append({"prompt": p})
                completions[i][w] = _hf_generate(model, tok, p, args.max_new_tokens)
            del model
    b, f = result["base"]["ppl"], result["finetuned"]["ppl"]
    result["difference"] = f - b
    result["difference_pct"] = 100.0 * (f - b) / b
    if completions:
        result["completions"] = completions
    # a temp file beside it, renamed when whole; a full disk: a ToolError naming it, nothing left
    atomic_write(args.out, json.dumps(result, indent=2) + "\n")
    result["written"] = str(args.out)
    return result


def _vision(rm: RunModel, args) -> dict:
    from toolbox_train.export import vision_eval

    examples = vision_eval.rows(rm, args.data)  # checked before anything is said or loaded
    say("answer perplexity of the base and the fine-tuned model on held-out image rows (transformers)")
    result = {"run": str(rm.run), "runtime": "hf", "score": "answer perplexity on image rows",
              "data": args.data or "the run's eval split", **vision_eval.evaluate(rm, examples)}
    b, f = result["base"]["ppl"], result["finetuned"]["ppl"]
    result["difference"], result["difference_pct"] = f - b, 100.0 * (f - b) / b
    atomic_write(args.out, json.dumps(result, indent=2) + "\n")
    result["written"] = str(args.out)
    return result


def report(r: dict) -> str:
    if "score" in r:  # a vision run
        return "\n".join([
            f"{r['score']} ({r['base']['rows']} rows, {r['base']['scored_tokens']} answer tokens of {r['data']})",
            f"  {'base':>12} {'fine-tuned':>12} {'difference':>18}",
            f"  {r['base']['ppl']:12.4f} {r['finetuned']['ppl']:12.4f} "
            f"{r['difference']:+11.4f} ({r['difference_pct']:+.1f}%)", f"written: {r['written']}"])
    lines = [f"perplexity ({r['runtime']}{', ' + r['quant'] if 'quant' in r else ''}; ctx {r['ctx']}, "
             f"{r['base']['scored_tokens']} scored tokens of {r['data']})",
             f"  {'base':>12} {'fine-tuned':>12} {'difference':>18}",
             f"  {r['base']['ppl']:12.4f} {r['finetuned']['ppl']:12.4f} "
             f"{r['difference']:+11.4f} ({r['difference_pct']:+.1f}%)"]
    for c in r.get("completions", []):
        lines += [f"prompt: {c['prompt']}", f"  base:       {c['base']!r}", f"  fine-tuned: {c['finetuned']!r}"]
    lines.append(f"written: {r['written']}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    return run_command("evaluate", _main, argv)


def _main(argv: list[str]) -> int:
    result = run(argv)
    print(json.dumps(result) if "--json" in argv else report(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
