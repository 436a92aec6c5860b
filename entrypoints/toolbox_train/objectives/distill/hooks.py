"""Distillation's hooks (units/objective.py): the teacher folder resolved and its vocabulary checked
against the student's config, its weights in the memory plan, its tokenizer checked against the
student's before anything loads (one line naming `distill.teacher`), the sampler picked once."""

from __future__ import annotations

import json
from pathlib import Path

from toolbox_train.contract import UserError, first_line
from toolbox_train.generation import sampler

TEACHER, GENERATION = "distill.teacher", "distill.generation"
# TRL 1.15's DistillationConfig has no continuous batching
# compiled: its loop serves GRPO and RLOO, not tested under TRL's DistillationTrainer
MODES = tuple(m for m in sampler.MODES if m not in ("transformers-paged", "compiled"))


def teacher_config(folder: Path) -> dict:
    cfg = folder / "config.json"
    try:
        return json.loads(cfg.read_text())
    except (OSError, ValueError) as exc:
        raise UserError(f"{TEACHER}: {cfg}: not readable as a model's config ({first_line(exc)})") from None


def resolve(ctx) -> dict:
    d = ctx.cfg.distill
    if not d.teacher:
        raise UserError(f"{TEACHER}: objective distill needs a teacher model folder")
    folder = Path(d.teacher).expanduser()
    folder = (folder if folder.is_absolute() else ctx.base / folder).resolve()
    if not folder.is_dir():
        raise UserError(f"{TEACHER}: {folder}: no such folder (a model folder: config.json, weights, tokenizer)")
    teacher_config(folder)
    return {"teacher": str(folder), **sampler.resolve(d, GENERATION, ctx, MODES)}


def memory(ctx, extras: dict, st, shape) -> tuple:
    """The teacher's weights (in the training precision, frozen) and the sampler's KV cache."""
    import dataclasses

    from toolbox_train.models.arithmetic import GiB, Shape

    d = ctx.cfg.distill
    teacher = Shape.from_config(teacher_config(Path(extras["teacher"])), name=extras["teacher"])
    st = dataclasses.replace(st, teacher_bytes=float(teacher.n_params() * (4 if st.precision == "fp32" else 2)))
    st, said = sampler.memory(ctx.cfg, extras, st, shape, ctx.world_size, d.max_completion_length, None)
    return st, f"teacher {st.teacher_bytes / GiB:.2f} GiB; {said}"


def _vocab_size(mc: dict):
    return (mc.get("text_config") or {}).get("vocab_size", mc.get("vocab_size"))


def prepare(p, tok, sets) -> None:
    """Before any weight loads: the sampler can run here, and the teacher's tokenizer is the student's (the
    loss compares the two distributions token by token: one vocabulary, the same ids)."""
    from transformers import AutoTokenizer

    folder = p.extras["teacher"]
    try:
        sampler.prepare(p.cfg.distill, GENERATION, p.backend, p.gpu)
        tv = _vocab_size(teacher_config(Path(folder)))
        sv = _vocab_size(p.model_config.to_dict())
        if tv != sv:
            raise UserError(f"{TEACHER}: {folder}: vocab_size {tv}, the student's ({p.model_path}) {sv}: the "
                            "loss compares their distributions over one vocabulary")
        try:
            ttok = AutoTokenizer.from_pretrained(folder, trust_remote_code=p.cfg.model.trust_remote_code)
        except Exception as exc:  # missing/corrupt tokenizer files
            raise UserError(f"{TEACHER}: {folder}: cannot load its tokenizer: {first_line(exc)[:300]}") from None
        theirs, ours = ttok.get_vocab(), tok.get_vocab()
        if theirs != ours:
            differ = sorted(t for t in theirs.keys() | ours.keys() if theirs.get(t) != ours.get(t))
            raise UserError(f"{TEACHER}: {folder}: its tokenizer is not the student's ({len(differ)} tokens differ, "
                            f"e.g. {differ[0]!r}: teacher {theirs.get(differ[0])}, student {ours.get(differ[0])}); "
                            "distill from a teacher of the student's family")
    except UserError as exc:
        raise UserError(p.locate(str(exc))) from None
