"""`evaluate` on a vision-language run: the base and the fine-tuned image-text model scored on held-out
image rows, in-process (transformers): llama-perplexity reads text only.

The score is the answers' perplexity: exp of the mean negative log-likelihood of the tokens finetune
trains on (training/vision.py's labels: the assistant turns, never the prompt or the image tokens), each
row run through the processor with its images, as in training.
"""

from __future__ import annotations

import math
from pathlib import Path

from toolbox_train.contract import UserError
from toolbox_train.runs.folder import RunModel, hf_model, loading, resolved_config

FORMATS = ("vision", "messages")  # image rows; conversations without images score on the language half


def rows(rm: RunModel, data: str | None) -> list[dict]:
    """The held-out rows (the run's eval split, or --data's file read and checked as finetune reads it)."""
    from toolbox_train.data.dataset import load_datasets, load_raw

    if data is None:
        cfg = resolved_config(rm.run, rm.resolved)
        if not cfg.data.has_eval():
            raise UserError(f"--run {rm.run}: the run had no eval split (data.eval_path / data.eval_split); "
                            "pass --data FILE")
        _, ds, _ = load_datasets(cfg, Path(rm.resolved.get("_base", "/")))
    else:
        if Path(data).suffix.lower() == ".txt":
            raise UserError(f"--data {data}: plain text; a vision run is scored on image rows (messages + images)")
        ds, fmt, _ = load_raw(str(Path(data).resolve()), "train", Path.cwd(), "--data", "auto", "text")
        if fmt not in FORMATS:
            raise UserError(f"--data {data}: {fmt} rows; a vision run is scored on image rows (messages + images)")
    out = [{"messages": r["messages"], "images": r.get("images") or []} for r in ds]
    if not out:
        raise UserError(f"--data {data or 'the eval split'}: no rows")
    return out


def answer_perplexity(model, collator, examples: list[dict], batch: int = 4) -> dict:
    import torch

    nll, count = 0.0, 0
    device = next(model.parameters()).device
    with torch.no_grad():
        for i in range(0, len(examples), batch):
            b = {k: v.to(device) if torch.is_tensor(v) else v for k, v in collator(examples[i:i + batch]).items()}
            labels = b.pop("labels")
            target = labels[:, 1:]
            keep = target != -100
            # only the scored positions in fp32 (a bf16 model on the GPU: its logits are bf16)
            logits = model(**b).logits[:, :-1][keep].float()
            nll += torch.nn.functional.cross_entropy(logits, target[keep], reduction="sum").item()
            count += int(keep.sum())
    if count == 0:
        raise UserError("held-out image rows: no answer tokens to score (every row's answer was cut or empty)")
    return {"ppl": math.exp(nll / count), "scored_tokens": count, "rows": len(examples)}


def evaluate(rm: RunModel, examples: list[dict]) -> dict:
    """{"base": {...}, "finetuned": {...}} of answer perplexity on the held-out image rows (rows())."""
    from toolbox_train.models.vision import budget, load_processor
    from toolbox_train.training.vision import VisionCollator

    cfg = resolved_config(rm.run, rm.resolved)
    with loading(f"--run {rm.run}: the processor"):
        proc = load_processor(str(rm.run), **budget(cfg))  # the resolution the run trained at
    collator = VisionCollator(proc, cfg.data.max_seq_length, "responses")
    base = rm.resolved["model"]["path"]
    result = {}
    for which in ("base", "finetuned"):
        model = hf_model(base, image_text=True) if which == "base" else (
            hf_model(rm.base, rm.run, True) if rm.kind == "adapter" else hf_model(str(rm.run), image_text=True))
        result[which] = {**answer_perplexity(model, collator, examples),
                         "model": base if which == "base" else str(rm.run)}
        del model
    return result
