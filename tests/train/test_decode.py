"""The compiled decoding loop (issue 46, `generation: compiled`, generation/decode.py): greedy completions
exactly generate's (left-padded prompts of different lengths, an EOS some sequences hit mid-way, a
smaller batch after a larger one), also with the step traced whole by torch.compile (fullgraph, dynamo's
eager backend: what the GPU's CUDA-graph compile needs, without a GPU); with a LoRA merged and unmerged
through the trainers; top_k 1 sampling is greedy; temperature + top_p sampling draws only from the top-p
set; GRPO and RLOO runs through finetune with it, TRL's tool loop decoding its later turns with it; and
what the loop cannot serve, set by hand, is refused in one line with its reason; and the step compiles once
over training steps (each recompile would be a new CUDA-graph capture on the GPU)."""

from __future__ import annotations

import json

import pytest
import yaml

from helpers import pref
from helpers.tiny import lora_trainers, train_config, write_train_config
from test_grpo_tools import TOOLS, _call, _chat_rows, _write, tool_model  # noqa: F401 (tool_model: a fixture)
from toolbox_train.commands import finetune

FULLGRAPH = {"backend": "eager", "fullgraph": True}
GRPO = {"objective": "grpo", "method": "lora", "train.per_device_batch_size": 4, "grpo.num_generations": 2,
        "grpo.max_completion_length": 8, "data.max_seq_length": 48, "train.max_steps": 1,
        "grpo.generation": "compiled", "grpo.rewards": [{"function": "length", "max_chars": 9}]}
PROMPTS = [[5, 9, 13, 20, 7, 33], [5, 9], [30, 31, 32], [40], [61, 62, 63, 64]]


@pytest.fixture(scope="module")
def tiny(tiny_model):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    return AutoModelForCausalLM.from_pretrained(tiny_model), AutoTokenizer.from_pretrained(tiny_model)


def _batch(tok, prompts=PROMPTS):
    import torch

    width = max(map(len, prompts))
    ids = torch.tensor([[tok.pad_token_id] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    return ids, mask


def _config(tok, **kw):
    from transformers import GenerationConfig

    return GenerationConfig(**{"max_new_tokens": 70, "do_sample": False, "pad_token_id": tok.pad_token_id,
                               "eos_token_id": [tok.eos_token_id], **kw})


@pytest.mark.parametrize("compile", [{}, FULLGRAPH], ids=["eager", "fullgraph"])
def test_greedy_completions_are_generates(tiny, compile):
    import torch

    from toolbox_train.generation import decode

    model, tok = tiny
    ids, mask = _batch(tok)
    width = ids.shape[1]
    free = model.generate(input_ids=ids, attention_mask=mask, generation_config=_config(tok))[:, width:]
    # EOS: a token greedy decoding makes mid-way in some sequences (the first of row 1 and the 5th of row 0);
    # with the tokens the other rows make late, every row ends and generate stops before max_new_tokens
    late = {int(free[r, 40 + r]) for r in range(len(PROMPTS))}
    eos = [int(free[1, 0]), int(free[0, 4]), *late]
    loop = decode.Loop(compile)
    for gc in (_config(tok), _config(tok, eos_token_id=eos[:2]), _config(tok, eos_token_id=eos)):
        want = model.generate(input_ids=ids, attention_mask=mask, generation_config=gc)
        got = loop.generate(model, ids, mask, gc)
        assert got.shape == want.shape and torch.equal(got, want), (got[:, width:], want[:, width:])
        # positions from the mask (a RoPE model's tokens would not show a shift common to a row): each row's
        # next position is its prompt's length plus the steps run
        assert loop.pos[:len(PROMPTS)].tolist() == [len(p) + int(loop.t) - 1 for p in PROMPTS]
    ended = want[:, width:]
    assert ended.shape[1] < 70 and (ended == tok.pad_token_id).any()  # stopped early; pads after an EOS
    # a smaller batch after the larger (a tool loop's later turn): the same cache and compiled step
    shape = loop.shape
    small = _batch(tok, PROMPTS[1:3])
    want = model.generate(input_ids=small[0], attention_mask=small[1], generation_config=_config(tok))
    assert torch.equal(loop.generate(model, *small, _config(tok)), want)
    assert loop.shape == shape == (len(PROMPTS), width + 70)  # generate's static cache size: prompt + new tokens
    # a longer one: the cache grows (by whole 256s), the completions still generate's
    gc = _config(tok, max_new_tokens=90)
    want = model.generate(input_ids=ids, attention_mask=mask, generation_config=gc)
    assert torch.equal(loop.generate(model, ids, mask, gc), want)
    assert loop.shape == (len(PROMPTS), 256)


def test_top_k_1_sampling_is_greedy(tiny):
    import torch

    from toolbox_train.generation import decode

    model, tok = tiny
    ids, mask = _batch(tok)
    want = model.generate(input_ids=ids, attention_mask=mask, generation_config=_config(tok, max_new_tokens=20))
    got = decode.Loop().generate(model, ids, mask, _config(tok, max_new_tokens=20, do_sample=True, top_k=1,
                                                            temperature=0.7))
    assert torch.equal(got, want)


@pytest.mark.parametrize("compile", [{}, FULLGRAPH], ids=["eager", "fullgraph"])
def test_top_p_sampling_draws_from_the_top_p_set_only(tiny, compile):
    """Each sampled token is inside the smallest set of tokens whose probability (at the temperature) reaches
    top_p, read off a fresh forward of the sequence so far (a little slack for the cache's rounding). The
    random tiny model's distributions are flat: sampling from all tokens would leave the set within a
    few draws."""
    import torch

    from toolbox_train.generation import decode

    model, tok = tiny
    ids, mask = _batch(tok)
    width = ids.shape[1]
    torch.manual_seed(0)
    top_p, temperature = 0.3, 0.7
    # top_k 0: generate's default top_k (50, filled in where unset) would keep the draws inside the set alone
    out = decode.Loop(compile).generate(model, ids, mask, _config(tok, max_new_tokens=24, do_sample=True, top_k=0,
                                                                   top_p=top_p, temperature=temperature))
    assert out.shape == (len(PROMPTS), width + 24)
    draws = outside = 0
    sizes = []
    with torch.no_grad():
        for r, p in enumerate(PROMPTS):
            seq = out[r, width - len(p):]
            probs = (model(input_ids=seq[None]).logits[0].float() / temperature).softmax(-1)
            for i in range(len(p) - 1, len(seq) - 1):
                ranked, order = probs[i].sort(descending=True)
                keep = int((ranked.cumsum(-1) < top_p + 0.02).sum()) + 1
                sizes.append(keep)
                draws += 1
                outside += int(seq[i + 1]) not in set(order[:keep].tolist())
    assert draws == len(PROMPTS) * 24 and outside == 0
    assert sum(sizes) / len(sizes) < probs.shape[-1] / 2  # the set is a part of the vocabulary (~85 of 320)
    assert len(set(out[:, width:].flatten().tolist())) > 10  # and it did sample (not a greedy run)


def test_lora_merged_and_unmerged_greedy_completions_are_generates(tmp_path, tiny_model):
    """Three trainers on one LoRA model: the compiled loop on merged weights, on the adapters unmerged,
    and TRL's default generate unmerged; the same greedy completions before and after an optimizer step."""
    import torch

    from toolbox_train.generation.trainer import CompiledLoop, MergedLora

    model, tok, trainers = lora_trainers(tmp_path, tiny_model, GRPO, {
        "merged": {"grpo.merge_lora": True}, "unmerged": {"grpo.merge_lora": False},
        "generate": {"grpo.generation": "transformers", "grpo.merge_lora": False}}, max_new_tokens=12)
    assert isinstance(trainers["merged"], CompiledLoop) and isinstance(trainers["merged"], MergedLora)
    assert isinstance(trainers["unmerged"], CompiledLoop) and not isinstance(trainers["unmerged"], MergedLora)
    assert not isinstance(trainers["generate"], CompiledLoop)
    prompts = [tok(s, add_special_tokens=False)["input_ids"] for s in ("w5 w9 w13 w20", "w3", "w7 w8")]

    def sample():
        model.train()  # as in training: TRL generates inside training_step
        return {n: t._generate_single_turn(prompts, None, {}, 1)[0] for n, t in trainers.items()}

    before = sample()
    assert trainers["merged"]._merged  # the loop decoded inside MergedLora's swap (its buffers were made)
    assert getattr(trainers["unmerged"], "_merged", None) is None
    opt = torch.optim.AdamW([w for n, w in model.named_parameters() if "lora_" in n], lr=0.05)
    ids = torch.tensor([prompts[0]])
    model(input_ids=ids, labels=ids).loss.backward()
    opt.step()
    for t in trainers.values():
        t.state.global_step += 1  # what the Trainer does after an optimizer step
    after = sample()
    assert before["merged"] == before["unmerged"] == before["generate"]
    assert after["merged"] == after["unmerged"] == after["generate"]
    assert after["generate"] != before["generate"]  # the step changed what the policy samples
    assert all(0 < len(c) <= 12 for c in after["merged"])


def _resolved(tmp_path, tiny_model, gpu=None, **over):
    from toolbox_train.planning.run import resolve

    prompts = pref.write(tmp_path / "g.jsonl", "prompt", 8)
    cfg = write_train_config(tmp_path / "t.yaml", tiny_model, prompts, tmp_path / "out", **{**GRPO, **over})
    kw = {"gpu": True, "device_memory": "80GiB", "probe_device": False} if gpu else {}
    return resolve(cfg, check_output=False, **kw).extras


def test_grpo_and_rloo_train_with_the_compiled_loop(tmp_path, tiny_model, monkeypatch):
    """Two GRPO steps (LoRA merged) and two RLOO steps (full) on the CPU: the resolved run names the
    sampler, and every generation went through the loop."""
    from toolbox_train.generation import decode

    calls = []
    real = decode.Loop.generate

    def counted(self, *a, **kw):
        calls.append(1)
        return real(self, *a, **kw)

    monkeypatch.setattr(decode.Loop, "generate", counted)
    prompts = pref.write(tmp_path / "g.jsonl", "prompt", 8)
    runs = {"grpo": {**GRPO, "train.max_steps": 2, "grpo.top_k": 20, "grpo.top_p": 0.9},
            "rloo": {"objective": "rloo", "method": "full", "train.per_device_batch_size": 4, "train.max_steps": 2,
                     "rloo.num_generations": 2, "rloo.max_completion_length": 6, "data.max_seq_length": 48,
                     "rloo.generation": "compiled", "rloo.rewards": [{"function": "length", "max_chars": 9}]}}
    for name, over in runs.items():
        out = tmp_path / name
        cfg = train_config(tiny_model, prompts, out, **over)
        (tmp_path / f"{name}.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
        assert finetune.main(["--config", str(tmp_path / f"{name}.yaml")]) == 0
        metrics = [json.loads(ln) for ln in (out / "metrics.jsonl").read_text().splitlines()]
        assert [m["step"] for m in metrics] == [1, 2] and all("reward" in m for m in metrics), metrics
        resolved = yaml.safe_load((out / "config.resolved.yaml").read_text())["_resolved"]
        assert (resolved["sampler"], resolved["sampler_why"]) == ("compiled", "set in the config"), resolved
        assert len(calls) == 2, calls  # one generation batch a step (gradient accumulation 1)
        calls.clear()


def test_the_loop_where_set_and_refused_where_it_cannot_serve(tmp_path, tiny_model, tiny_models):
    from toolbox_train.contract import UserError

    # auto stays the static cache on a GPU until a GPU row measures the loop against it (docs/bench/NEXT-CALL.md)
    extras = _resolved(tmp_path, tiny_model, gpu=True, **{"grpo.generation": "auto"})
    assert extras["sampler"] == "transformers-static", extras
    extras = _resolved(tmp_path, tiny_model, **{"grpo.generation": "auto"})  # the CPU: today's pick
    assert extras["sampler"] == "transformers", extras
    extras = _resolved(tmp_path, tiny_model, gpu=True)  # set in the config (GRPO)
    assert extras["sampler"] == "compiled" and extras["sampler_why"] == "set in the config", extras
    extras = _resolved(tmp_path, tiny_model, gpu=True, **{"grpo.top_p": 0.9, "grpo.top_k": 5, "grpo.min_p": 0.1})
    assert extras["sampler"] == "compiled", extras  # TRL's other sampling settings: the loop has them
    # set by hand where it cannot serve the run: refused with the reason, as merge_lora: true is
    with pytest.raises(UserError) as e:
        _resolved(tmp_path, tiny_model, gpu=True, **{"grpo.repetition_penalty": 1.1})
    assert str(e.value).endswith("grpo.generation: compiled cannot serve this run: the generation config: "
                                 "repetition_penalty 1.1 (the compiled loop has no repetition_penalty); use "
                                 "transformers-static (or auto)"), e.value  # after the config file's name
    with pytest.raises(UserError, match=r"; use transformers \(or auto\)$"):  # the CPU's sampler named
        _resolved(tmp_path, tiny_model, **{"grpo.repetition_penalty": 1.1})
    with pytest.raises(UserError, match="the model: its cache has sliding-window"):
        _resolved(tmp_path, tiny_models("gemma3"), gpu=True)
    # what TRL leaves unset comes from the model's generation_config.json, as generate reads it
    import shutil

    model = shutil.copytree(tiny_model, tmp_path / "model")
    (model / "generation_config.json").write_text(json.dumps({"no_repeat_ngram_size": 3, "top_p": 0.5}))
    with pytest.raises(UserError, match="no_repeat_ngram_size 3"):
        _resolved(tmp_path, model, gpu=True)


def test_a_run_it_cannot_serve_is_one_line_and_exit_2_before_anything_is_written(tmp_path, tiny_model, capsys):
    prompts = pref.write(tmp_path / "g.jsonl", "prompt", 8)
    out = tmp_path / "out"
    cfg = write_train_config(tmp_path / "t.yaml", tiny_model, prompts, out, **{**GRPO, "grpo.repetition_penalty": 1.1})
    assert finetune.main(["--config", str(cfg)]) == 2
    err = capsys.readouterr().err
    assert "grpo.generation: compiled cannot serve this run: the generation config: repetition_penalty 1.1" in err
    assert "Traceback" not in err and not out.exists(), err


def test_the_tool_loop_decodes_each_turn_with_the_loop(tmp_path, tool_model, monkeypatch):
    """TRL's tool loop calls `_generate_single_turn` per turn: the first turn scripted (a call of add, as in
    test_grpo_tools), the turn after the tool's result decoded by the compiled loop, on the LoRA merged; the
    tool's result reaches the reward."""
    from toolbox_train.generation import decode
    from toolbox_train.generation.trainer import CompiledLoop

    real_turn, real_generate = CompiledLoop._generate_single_turn, decode.Loop.generate
    batches = []

    def turn(self, prompt_ids, images, multimodal_fields, *args, **kw):
        if not any("<tool_response>" in t for t in self.processing_class.batch_decode(prompt_ids)):
            eos = self.processing_class.eos_token_id
            return [self.processing_class(_call("add", a=2, b=3), add_special_tokens=False)["input_ids"] + [eos]
                    for _ in prompt_ids], None
        assert self._merged  # inside MergedLora's swap
        return real_turn(self, prompt_ids, images, multimodal_fields, *args, **kw)

    def generate(self, model, input_ids, *a, **kw):
        batches.append(input_ids.shape[0])
        return real_generate(self, model, input_ids, *a, **kw)

    monkeypatch.setattr(CompiledLoop, "_generate_single_turn", turn)
    monkeypatch.setattr(decode.Loop, "generate", generate)
    monkeypatch.setenv("TOOL_LOG", str(tmp_path / "tool.jsonl"))
    monkeypatch.setenv("SEEN_LOG", str(tmp_path / "seen.jsonl"))
    (tmp_path / "agent.py").write_text(TOOLS)
    cfg = _write(tmp_path, tool_model, _chat_rows(tmp_path / "d.jsonl"), **{
        "grpo.generation": "compiled", "grpo.tools": ["agent:add"],
        "grpo.rewards": [{"function": "agent:used_the_tool"}], "grpo.max_tool_calling_iterations": 1})
    assert finetune.main(["--config", str(cfg)]) == 0
    assert len((tmp_path / "tool.jsonl").read_text().splitlines()) == 8  # 2 steps x 4 calls, each ran
    assert batches == [4, 4]  # the second turn of each step, decoded by the loop
    rows = [json.loads(ln) for ln in (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()]
    assert [(r["reward"], r["tools/calls"], r["tools/failures"]) for r in rows] == [(1.0, 4, 0)] * 2
    resolved = yaml.safe_load((tmp_path / "out" / "config.resolved.yaml").read_text())["_resolved"]
    assert resolved["sampler"] == "compiled" and resolved["sampler_merged"] is True


def test_the_step_compiles_once_over_training_steps(tmp_path, tiny_model):
    """What the GPU run pays for once, not each step: the step traced whole (dynamo, fullgraph) is compiled
    once for a trainer's prompts of one length, and stays compiled after an optimizer step (new weights, the
    LoRA merged into the same buffers again) and for shorter prompts and a smaller batch (a later turn).
    A recompile would be a new CUDA-graph capture (seconds to minutes) on the GPU."""
    import torch
    from torch._dynamo.utils import counters

    from toolbox_train.generation import decode

    model, tok, trainers = lora_trainers(tmp_path, tiny_model, GRPO, {
        "merged": {"grpo.merge_lora": True}, "unmerged": {"grpo.merge_lora": False}}, max_new_tokens=12)
    prompts = [tok(s, add_special_tokens=False)["input_ids"] for s in ("w5 w9 w13 w20", "w3", "w7 w8")]
    opt = torch.optim.AdamW([w for n, w in model.named_parameters() if "lora_" in n], lr=0.05)
    ids = torch.tensor([prompts[0]])
    torch._dynamo.reset()
    counters.clear()
    for name, t in trainers.items():
        t._loop = decode.Loop(FULLGRAPH)
        model.train()
        for step in range(3):
            t._generate_single_turn(prompts if step < 2 else prompts[1:], None, {}, 1)
            model(input_ids=ids, labels=ids).loss.backward()
            opt.step()
            opt.zero_grad()
            t.state.global_step += 1
        assert t._loop.shape == (3, max(map(len, prompts)) + 12), name
    # one graph per trainer: the merged LoRA's and the unmerged adapters' (two models as dynamo sees them)
    assert counters["stats"]["unique_graphs"] == 2, dict(counters["stats"])


def test_inductor_lowers_the_step_greedy_equal_and_sampling_seeded(tiny):
    """The step through inductor, as the GPU compiles it (there with Triton's kernels and CUDA graphs; here
    C++): every op of it lowers (the exponential race's draw, the in-place writes at a tensor index, isin),
    greedy completions stay generate's, and sampling repeats under one seed."""
    import torch

    from toolbox_train.generation import decode

    model, tok = tiny
    ids, mask = _batch(tok)
    loop = decode.Loop({"fullgraph": True, "dynamic": False})  # inductor: torch.compile's default backend
    gc = _config(tok, max_new_tokens=24)
    assert torch.equal(loop.generate(model, ids, mask, gc),
                       model.generate(input_ids=ids, attention_mask=mask, generation_config=gc))
    sampling = _config(tok, max_new_tokens=24, do_sample=True, top_k=0, top_p=0.9, temperature=0.8)
    draws = []
    for _ in range(2):
        torch.manual_seed(1)
        draws.append(loop.generate(model, ids, mask, sampling))
    assert torch.equal(*draws) and len(set(draws[0][:, ids.shape[1]:].flatten().tolist())) > 10
