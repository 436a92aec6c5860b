"""The checks that need the tokenizer but not the model, run on every row before anything is
written: the chat template over every conversation, and the rows whose whole completion
truncation at data.max_seq_length would cut (TRL drops them; all of them is bad input); then the
objective's own (its unit's prepare hook, once: what its trainer is given)."""

from __future__ import annotations

import dataclasses
from itertools import islice

from toolbox_train.data import images, pref_rows
from toolbox_train.data.dataset import Locate, load_datasets
from toolbox_train.contract import UserError, first_line
from toolbox_train.planning.run import ResolvedRun, log, with_data_format
from toolbox_train.data.rowcheck import NAMED, refuse


def load_tokenizer(p: ResolvedRun):
    from transformers import AutoTokenizer

    try:
        tok = AutoTokenizer.from_pretrained(p.model_path, revision=p.cfg.model.revision,
                                            trust_remote_code=p.cfg.model.trust_remote_code)
    except Exception as exc:  # missing/corrupt tokenizer files: tokenizers, sentencepiece, json errors
        reason = first_line(exc)
        raise UserError(f"model.path: {p.model_path}: cannot load the tokenizer: {reason[:300]}") from None
    return getattr(tok, "tokenizer", tok)


def _rows(ds, column: str):
    for batch in ds.iter(batch_size=256):
        yield from batch[column]


def assistant_template(p: ResolvedRun, tok) -> str | None:
    """data.train_on: responses on chat rows: the template TRL's SFTTrainer masks the assistant turns with
    (None: the model's own, which has {% generation %} markers; else TRL's training template for it),
    or a refusal where there is none (TRL would raise once the model had loaded)."""
    import trl
    from trl.chat_template_utils import get_training_chat_template, has_generation_markers

    if has_generation_markers(tok.chat_template):
        return None
    try:
        return get_training_chat_template(tok)
    except ValueError:
        raise UserError(f"data.train_on: responses (the default) trains on the assistant turns, but the chat template "
                        f"of {p.model_path} has no {{% generation %}} markers to find them and TRL {trl.__version__} "
                        "has no training template for it; set data.train_on: all (every token), or give the "
                        "tokenizer a chat template with the markers") from None


def check_chat_template(tok, ds, locate: Locate, field: str, masks: bool = False, template: str | None = None) -> None:
    """Every conversation through the chat template; with `masks` (assistant-only loss), through the
    template that marks the assistant turns, and each must have some (TRL raises on one without)."""
    bad: list[tuple[str, str]] = []
    count = total = 0
    for i, messages in enumerate(_rows(ds, "messages")):
        total += 1
        try:
            if not masks:
                tok.apply_chat_template(messages, tokenize=False)
                continue
            out = tok.apply_chat_template(messages, chat_template=template, tokenize=True, return_dict=True,
                                          return_assistant_tokens_mask=True)
            if 1 in out["assistant_masks"]:
                continue
            why = "no assistant turn to train on (data.train_on: responses)"
        except Exception as exc:  # jinja2's TemplateError (raise_exception), or no template at all
            why = f"the model's chat template rejects this conversation: {first_line(exc)[:200]}"
        count += 1
        if len(bad) < NAMED:
            bad.append((locate(i), why))
    refuse(bad, count, total, field)


def check_preference_chats(tok, ds, locate: Locate, field: str) -> None:
    """Conversational preference rows: the chat template over prompt + each completion (what TRL
    renders), so a role the template refuses is named here, not after the model has loaded."""
    cols = [c for c in ("prompt", "chosen", "rejected", "completion") if c in ds.column_names]
    bad: list[tuple[str, str]] = []
    count = total = 0
    for i, row in enumerate(zip(*(_rows(ds, c) for c in cols))):
        total += 1
        row = dict(zip(cols, row))
        if not isinstance(next(iter(row.values())), list):
            continue  # standard (string) rows: no template
        prompt = row.get("prompt") or []
        try:
            for key in ("chosen", "rejected", "completion"):
                if key in row:
                    tok.apply_chat_template(prompt + row[key], tokenize=False)
            if len(row) == 1:  # prompt-only (GRPO): rendered with the generation prompt
                tok.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True)
        except Exception as exc:  # jinja2's TemplateError (raise_exception), or no template at all
            count += 1
            if len(bad) < NAMED:
                bad.append((locate(i), f"the model's chat template rejects this conversation: {first_line(exc)[:200]}"))
    refuse(bad, count, total, field)


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def check_completion_lengths(tok, ds, locate: Locate, field: str, max_len: int) -> None:
    """Prompt-completion rows: the completion starts where the tokenized prompt and
    prompt+completion+EOS part (as TRL computes it); truncation keeps the first `max_len` tokens."""
    eos = tok.eos_token or ""
    lost: list[int] = []
    total = 0
    for i, (prompt, completion) in enumerate(zip(_rows(ds, "prompt"), _rows(ds, "completion"))):
        total += 1
        full = completion if completion.endswith(eos) else completion + eos
        start = _common_prefix(tok(prompt)["input_ids"], tok(prompt + full)["input_ids"])
        if start >= max_len:
            lost.append(i)
    if not lost:
        return
    named = ", ".join(locate(i) for i in islice(lost, NAMED))
    msg = (f"{len(lost)} of {total} rows lose their whole completion to truncation at "
           f"data.max_seq_length {max_len} (the prompt alone fills it), e.g. {named}")
    if len(lost) == total:
        raise UserError(f"{field}: {msg}; raise data.max_seq_length or shorten the prompts")
    log(f"warning: {field}: {msg}; they are left out")


def check_image_rows(p: ResolvedRun, ds, locate: Locate, field: str) -> None:
    """Image rows: a vision-language model with a processor, no packing, every row through its chat template."""
    from toolbox_train.models import vision

    if not p.multimodal:
        images.refuse_text_model(p.model_path, field)
    if p.cfg.data.packing:
        raise UserError("data.packing: image rows are not packed (an image's tokens and pixels belong to one row, "
                        "and TRL packs token ids only); set it to false")
    proc = vision.load_processor(p.model_path, p.cfg.model.revision, p.cfg.model.trust_remote_code,
                                 **vision.budget(p.cfg))
    why = vision.budget_problem(proc, p.cfg) or (
        p.cfg.method != "full" and not {"language", "vision"} & set(p.cfg.vision.train)
        and "vision.train: LoRA adapts the language model or the vision tower; [projector] alone has nothing to "
            "adapt (use method: full, or add language or vision)")
    if why:
        raise UserError(why)
    bad = vision.row_problems(proc, ds, locate, p.cfg.data.max_seq_length, p.cfg.data.train_on == "responses")
    refuse(bad[:NAMED], len(bad), len(ds), field)


def validate(p: ResolvedRun):
    """Every dataset row against the format, then the tokenizer's checks, then the objective's prepare
    hook: (the run with its data format and its trainer's inputs, train, eval).

    Runs before anything is written (finetune) or any rank starts (launch).
    """
    try:
        tok = load_tokenizer(p)
    except UserError as exc:
        raise UserError(p.locate(str(exc))) from None

    masks = p.objective.token_loss and p.cfg.data.train_on == "responses"
    template: list = []  # assistant_template's, once there are chat rows

    def check(ds, fmt: str, locate: Locate, field: str) -> None:
        if fmt == images.FORMAT:
            check_image_rows(p, ds, locate, field)
        elif fmt == "messages":
            if masks and tok.chat_template and not template:
                template.append(assistant_template(p, tok))
            check_chat_template(tok, ds, locate, field, masks and bool(tok.chat_template), template and template[0])
        elif fmt == "alpaca" and not p.cfg.data.packing:  # packing chunks rows instead of truncating
            check_completion_lengths(tok, ds, locate, field, p.cfg.data.max_seq_length)
        elif fmt in pref_rows.FORMATS:
            check_preference_chats(tok, ds, locate, field)

    try:
        loaded = load_datasets(p.cfg, p.base, check=check)
    except UserError as exc:  # data.path / data.eval_path / data.format: where the config says so
        raise UserError(p.locate(str(exc))) from None
    train, evald, fmt = loaded
    sets = [(train, "data.path")] + ([(evald, "data.eval_path")] if p.cfg.data.eval_path else [])
    p = dataclasses.replace(p, data_format=fmt)
    try:  # the plan for the rows read (it took a multimodal model's for image rows of one image)
        p = with_data_format(p, max(len(r["images"] or []) for r in train) if fmt == images.FORMAT else 0)
    except UserError as exc:
        raise UserError(p.locate(str(exc))) from None
    if p.objective.prepare:  # e.g. reward functions resolved and tried (launch checks them too)
        p = dataclasses.replace(p, inputs=p.objective.prepare(p, tok, sets))
    return p, train, evald
