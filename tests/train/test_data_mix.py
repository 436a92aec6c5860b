"""Loss masking (data.train_on) and dataset mixtures (data.sources), on the CPU with the tiny models."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
import yaml
from transformers import AutoTokenizer, TrainerCallback

from helpers.tiny import PLAIN_CHAT_TEMPLATE, train_config, write_dataset
from toolbox_train.planning import preflight
from toolbox_train.contract import UserError
from toolbox_train.commands import finetune
from toolbox_train.config.schema import load_config
from toolbox_train.data.dataset import load_datasets

NO_OUTPUT = "nothing may be written"


class Grab(TrainerCallback):
    """The first training batch, as the collator made it, and the model."""

    def on_train_begin(self, args, state, control, train_dataloader=None, model=None, **kw):
        self.batch = next(iter(train_dataloader))
        self.model = model


def _first_batch(tmp_path, model, data, **over):
    grab = Grab()
    cfg = train_config(model, data, tmp_path / "out", **{"train.max_steps": 1, "data.max_seq_length": 128, **over})
    finetune.run(cfg, callbacks=[grab])
    return grab, AutoTokenizer.from_pretrained(model)


def _labelled(tok, batch):
    """(whole sequence, the labelled tokens) of each row, decoded."""
    rows = []
    for ids, labels, attn in zip(batch["input_ids"], batch["labels"], batch["attention_mask"]):
        rows.append((tok.decode(ids[attn.bool()]), tok.decode(ids[labels != -100])))
    return rows


def test_chat_rows_train_on_the_assistant_turns_only(tmp_path, tiny_model):
    rows = [{"messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": f"say: the cat {i}"},
                          {"role": "assistant", "content": f"the cat {i}"}, {"role": "user", "content": "again"},
                          {"role": "assistant", "content": f"a dog {i}"}]} for i in range(8)]
    data = tmp_path / "chat.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    grab, tok = _first_batch(tmp_path, tiny_model, data)
    for whole, labelled in _labelled(tok, grab.batch):
        i = whole.split("say: the cat ")[1].split("<|end|>")[0]
        assert labelled == f"the cat {i}<|end|>a dog {i}<|end|>", (whole, labelled)  # both assistant turns, nothing else

    # The masked positions carry no loss: the model's loss on these labels sends no gradient to their logits.
    model, b = grab.model, grab.batch
    out = model(input_ids=b["input_ids"], attention_mask=b["attention_mask"])
    logits = out.logits.detach().requires_grad_(True)
    loss = model.loss_function(logits, b["labels"], vocab_size=logits.shape[-1])
    loss.backward()
    target = torch.nn.functional.pad(b["labels"], (0, 1), value=-100)[:, 1:]  # what position t predicts
    per_pos = logits.grad.abs().sum(-1)
    assert per_pos[target == -100].max() == 0 and (per_pos[target != -100] > 0).all()
    everything = model.loss_function(logits, torch.where(b["attention_mask"].bool(), b["input_ids"], -100),
                                     vocab_size=logits.shape[-1])
    assert abs(everything.item() - loss.item()) > 1e-3  # the prompt tokens would have changed it


def test_alpaca_rows_train_on_the_completion_and_all_trains_on_everything(tmp_path, tiny_model):
    data = write_dataset(tmp_path / "alpaca.jsonl", "alpaca", n=8)
    grab, tok = _first_batch(tmp_path, tiny_model, data)
    for whole, labelled in _labelled(tok, grab.batch):
        sentence = whole.split("### Input:\n")[1].split("\n")[0]
        assert labelled == f"{sentence}</s>", (whole, labelled)
    chat = write_dataset(tmp_path / "chat.jsonl", "messages", n=8)
    grab, tok = _first_batch(tmp_path / "all", tiny_model, chat, **{"data.train_on": "all"})
    for whole, labelled in _labelled(tok, grab.batch):
        assert labelled == whole and "<|user|>say:" in labelled


def _refused(capsys, cfg: dict, tmp_path: Path, expect: list[str]) -> str:
    path = tmp_path / "train.yaml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    out = Path(cfg["output"]["dir"])
    assert finetune.main(["--config", str(path)]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and len([ln for ln in err.splitlines() if ln.startswith("finetune:")]) == 1, err
    for e in expect:
        assert e in err, err
    assert not out.exists(), NO_OUTPUT
    return err


def test_a_template_that_cannot_mark_assistant_turns_is_refused(tmp_path, tiny_model, capsys):
    plain = tmp_path / "plain-model"
    shutil.copytree(tiny_model, plain)
    (plain / "chat_template.jinja").write_text(PLAIN_CHAT_TEMPLATE)
    chat = write_dataset(tmp_path / "chat.jsonl", "messages", n=8)
    _refused(capsys, train_config(plain, chat, tmp_path / "out"), tmp_path,
             ["data.train_on: responses", f"chat template of {plain}", "{% generation %}", "data.train_on: all"])
    # train_on: all needs no markers; alpaca rows need none either.
    assert finetune.run(train_config(plain, chat, tmp_path / "o1", **{"data.train_on": "all", "train.max_steps": 1}))
    alpaca = write_dataset(tmp_path / "alpaca.jsonl", "alpaca", n=8)
    assert finetune.run(train_config(plain, alpaca, tmp_path / "o2", **{"train.max_steps": 1, "data.max_seq_length": 128}))


def test_a_template_trl_has_a_training_template_for_is_accepted(tmp_path, tiny_model):
    import trl

    qwen3 = tmp_path / "qwen3-template"
    shutil.copytree(tiny_model, qwen3)
    shutil.copy(Path(trl.__file__).parent / "chat_templates" / "qwen3.jinja", qwen3 / "chat_template.jinja")
    chat = write_dataset(tmp_path / "chat.jsonl", "messages", n=4)
    p = finetune.resolve(train_config(qwen3, chat, tmp_path / "out"))
    p, train, _ = preflight.validate(p)
    fmt = p.data_format  # TRL swaps in its qwen3 training template: no refusal
    assert fmt == "messages" and len(train) == 4


def test_a_conversation_without_an_assistant_turn_is_named(tmp_path, tiny_model, capsys):
    good = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}
    data = tmp_path / "chat.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in [good, good, {"messages": [{"role": "user", "content": "hm"}]}]))
    _refused(capsys, train_config(tiny_model, data, tmp_path / "out"), tmp_path,
             [f"{data}:3: no assistant turn to train on (data.train_on: responses)"])


# --- mixtures ---


def _lines(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _two_text_sources(tmp_path, n=300):
    a = _lines(tmp_path / "a.jsonl", [{"text": f"a {i}"} for i in range(n)])
    b = _lines(tmp_path / "b.jsonl", [{"body": f"b {i}"} for i in range(n)])  # its own field name
    return a, b


def _mix(tmp_path, sources, extra=None, **over):
    extra = extra or {}
    raw = train_config("m", "unused", tmp_path / "out", **over)
    raw["data"] = {"sources": sources, "max_seq_length": 32, **extra}
    c, base = load_config(raw)
    return load_datasets(c, base)


def test_weighted_mixture_is_seeded_and_keeps_its_proportions(tmp_path):
    a, b = _two_text_sources(tmp_path)
    sources = [{"path": str(a), "weight": 3}, {"path": str(b), "text_field": "body", "weight": 1}]
    orders = {}
    for seed in (0, 1, 2):
        train, evald, fmt = _mix(tmp_path, sources, **{"train.seed": seed})
        assert fmt == "text" and evald is None and train.column_names == ["text"]
        texts = train["text"]
        share = sum(t.startswith("a ") for t in texts) / len(texts)
        # Each row's source is drawn (p = 3/4) until a source runs out: within 0.06 of 3/4 on ~400 rows.
        assert abs(share - 0.75) < 0.06, (seed, share, len(texts))
        assert len(set(texts)) == len(texts)  # first_exhausted: no row twice
        orders[seed] = texts
    assert _mix(tmp_path, sources, **{"train.seed": 0})[0]["text"] == orders[0]  # same seed, same order
    assert orders[0] != orders[1] and orders[1] != orders[2]
    # all_exhausted: the smaller share repeats until every source has been seen whole.
    texts = _mix(tmp_path, sources, {"stopping_strategy": "all_exhausted"})[0]["text"]
    assert len(texts) > 2 * 300
    assert {t for t in texts if t.startswith("a ")} == {f"a {i}" for i in range(300)}
    assert {t for t in texts if t.startswith("b ")} == {f"b {i}" for i in range(300)}


def test_each_source_holds_out_its_own_eval_rows(tmp_path):
    a, b = _two_text_sources(tmp_path, n=100)
    b_eval = _lines(tmp_path / "b-eval.jsonl", [{"body": f"held {i}"} for i in range(7)])
    sources = [{"path": str(a), "eval_split": 0.1}, {"path": str(b), "text_field": "body", "eval_path": str(b_eval)}]
    train, evald, _ = _mix(tmp_path, sources)
    assert len(train) == 90 + 100  # no weights: every training row once
    ev = evald["text"]
    assert len(ev) == 10 + 7 and sum(t.startswith("held ") for t in ev) == 7
    assert not set(ev) & set(train["text"])  # held-out rows never train
    again = _mix(tmp_path, sources)[1]["text"]
    assert again == ev  # the split is seeded


@pytest.mark.parametrize("suffix", [".jsonl", ".csv"])
def test_a_source_names_its_own_columns(tmp_path, suffix):
    import csv

    rows = [{"question": f"Repeat {i}.", "context": "", "answer": f"the cat {i}", "output": "stale"} for i in range(6)]
    qa = tmp_path / f"qa{suffix}"
    if suffix == ".jsonl":
        _lines(qa, rows)
    else:
        with qa.open("w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows(rows)
    chat = _lines(tmp_path / "dialog.jsonl", [{"dialog": [{"role": "user", "content": "hi"},
                                                          {"role": "assistant", "content": "yo"}]}] * 4)
    sources = [{"path": str(chat), "fields": {"messages": "dialog"}},
               {"path": str(qa), "fields": {"instruction": "question", "input": "context", "output": "answer"}}]
    train, _, fmt = _mix(tmp_path, sources)
    assert fmt == "messages" and len(train) == 10
    answers = sorted(r[1]["content"] for r in train["messages"] if r[0]["content"] != "hi")
    assert answers == [f"the cat {i}" for i in range(6)]  # the mapped column, not the file's own `output`
    with pytest.raises(UserError, match=rf"data.sources.1.fields.output: {qa}: no column 'reply'"):
        _mix(tmp_path, [sources[0], {**sources[1], "fields": {"instruction": "question", "output": "reply"}}])


def test_chat_and_alpaca_sources_train_together_on_the_responses(tmp_path, tiny_model, monkeypatch):
    # Issue 32's whole config: two sources (chat + alpaca), loss on the answers (the default) and MLflow.
    for k in ("MLFLOW_TRACKING_URI", "MLFLOW_EXPERIMENT_NAME"):  # unset, and put back after (the run sets them)
        monkeypatch.setenv(k, "x")
        monkeypatch.delenv(k)
    chat = write_dataset(tmp_path / "chat.jsonl", "messages", n=24)
    alpaca = write_dataset(tmp_path / "alpaca.jsonl", "alpaca", n=24, seed=1)
    cfg = train_config(tiny_model, "unused", tmp_path / "out", **{
        "train.max_steps": 6, "data.max_seq_length": 128, "data.train_on": "responses",
        "output.report_to": ["mlflow"], "output.mlflow": {"experiment": "mix"}})
    cfg["data"] = {"sources": [{"path": str(chat), "weight": 1}, {"path": str(alpaca), "format": "alpaca", "weight": 1,
                                                                  "eval_split": 0.25}],
                   "max_seq_length": 128}
    grab = Grab()
    s = finetune.run(cfg, callbacks=[grab])
    assert s["steps"] == 6 and s["last_loss"] < s["first_loss"] and s["eval_loss"] is not None
    resolved = yaml.safe_load((tmp_path / "out" / "config.resolved.yaml").read_text())
    assert resolved["_resolved"]["data_format"] == "messages" and len(resolved["data"]["sources"]) == 2
    tok = AutoTokenizer.from_pretrained(tiny_model)
    for whole, labelled in _labelled(tok, grab.batch):
        # a chat row ("say: S") or an alpaca row as a user turn ("Repeat the sentence.\n\nS"): only S is trained on
        user = whole.split("<|user|>")[1].split("<|end|>")[0]
        sentence = user.removeprefix("say: ").removeprefix("Repeat the sentence.\n\n")
        assert labelled == f"{sentence}<|end|>", (whole, labelled)
    # the MLflow run (sqlite store in the output folder, read with mlflow's client) holds metrics.jsonl's loss
    from mlflow.tracking import MlflowClient

    out = tmp_path / "out"
    client = MlflowClient(tracking_uri=f"sqlite:///{out / 'mlflow.db'}")
    (run,) = client.search_runs([client.get_experiment_by_name("mix").experiment_id])
    want = [(r["step"], r["loss"]) for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines())]
    assert len(want) == 6
    assert sorted((m.step, m.value) for m in client.get_metric_history(run.info.run_id, "loss")) == want


def test_a_resumed_mixture_sees_the_same_rows(tmp_path, tiny_model, monkeypatch):
    a, b = _two_text_sources(tmp_path, n=40)

    def cfg(out):
        c = train_config(tiny_model, "unused", out, **{"train.max_steps": 7, "train.per_device_batch_size": 3,
                                                      "output.save_steps": 2, "train.optimizer": "adamw_torch"})
        c["data"] = {"sources": [{"path": str(a), "weight": 2}, {"path": str(b), "text_field": "body", "weight": 1}],
                     "max_seq_length": 32}
        return c

    finetune.run(cfg(tmp_path / "ref"))
    monkeypatch.setenv("TOOLBOX_STOP_AFTER_STEP", "4")
    assert finetune.run(cfg(tmp_path / "cut"))["steps"] == 4
    monkeypatch.delenv("TOOLBOX_STOP_AFTER_STEP")
    assert finetune.run(cfg(tmp_path / "cut"), resume=True)["steps"] == 7
    from safetensors.torch import load_file

    ref, cut = (load_file(str(tmp_path / d / "model.safetensors")) for d in ("ref", "cut"))
    assert max((ref[k] - cut[k]).abs().max().item() for k in ref) <= 1e-6
    losses = [[json.loads(x)["loss"] for x in (tmp_path / d / "metrics.jsonl").read_text().splitlines()]
              for d in ("ref", "cut")]
    assert len(losses[1]) == 7 and losses[1] == pytest.approx(losses[0], abs=1e-5)


@pytest.mark.parametrize("sources,data_extra,expect", [
    ([{"path": "A", "weight": 1}, {"path": "B", "weight": 0}], {}, ["data.sources.1.weight", "greater than 0"]),
    ([{"path": "A", "weight": 1}, {"path": "B"}], {}, ["data.sources.1.weight: required when another source"]),
    ([{"path": "A", "colour": "red"}], {}, ["data.sources.0.colour: unknown key"]),
    ([{"path": "A", "fields": {"answer": "x"}}], {}, ["data.sources.0.fields: 'answer' is not a field"]),
    ([{"path": "A"}, {"path": "missing.jsonl"}], {}, ["data.sources.1.path:", "missing.jsonl: no such file"]),
    ([{"path": "A"}], {"path": "A"}, ["data.sources: give data.path or data.sources, not both"]),
    ([{"path": "A"}], {"eval_split": 0.1}, ["data.eval_split: with data.sources it is set per source"]),
    ([{"path": "A"}, {"path": "C", "format": "alpaca"}], {}, ["data.sources.1.format: alpaca rows do not mix"]),
    ([{"path": "A"}, {"path": "BAD"}], {}, ["data.sources.1.path:", "bad.jsonl:2: no 'text' field"]),
    ([], {}, ["data.sources", "at least 1"]),
])
def test_bad_mixture_configs_are_one_line_naming_the_field(tmp_path, tiny_model, capsys, sources, data_extra, expect):
    files = {"A": _lines(tmp_path / "a.jsonl", [{"text": "the cat."}] * 4),
             "B": _lines(tmp_path / "b.jsonl", [{"text": "a dog."}] * 4),
             "C": write_dataset(tmp_path / "c.jsonl", "alpaca", n=4),
             "BAD": _lines(tmp_path / "bad.jsonl", [{"text": "ok"}, {"txt": "no"}])}
    for s in sources:
        s["path"] = str(files.get(s["path"], s["path"]))
    cfg = train_config(tiny_model, "unused", tmp_path / "out")
    cfg["data"] = {"sources": sources, "max_seq_length": 32,
                   **{k: str(files.get(v, v)) if k == "path" else v for k, v in data_extra.items()}}
    err = _refused(capsys, cfg, tmp_path, expect)
    if "unknown key" in expect[0] or "weight" in expect[0]:
        assert "train.yaml:" in err  # at the line it is written on
