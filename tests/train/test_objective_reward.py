"""`objective: reward` (issue 39), the unit the objective registry was proved with: TRL's
RewardTrainer on chosen/rejected rows, full and LoRA, on CPU with the tiny model given a
one-label score head. Its loss is TRL's -log sigmoid(r_chosen - r_rejected), computed here from
the starting weights; the run folder loads as a reward model, and GRPO takes it as a reward
(`grpo.rewards: [{model: FOLDER}]`), its rewards the model's own scores of prompt + completion."""

from __future__ import annotations

import json

import pytest
import torch
import yaml

from helpers import pref
from helpers.tiny import train_config
from toolbox_train.commands import finetune
from toolbox_train.contract import UserError


def _cfg(tmp_path, model, kind="preference", name="out", **over):
    data = pref.write(tmp_path / f"{kind}.jsonl", kind, n=8)
    base = {"objective": "reward", "train.max_steps": 2, "train.per_device_batch_size": 8,
            "data.max_seq_length": 48, "lora.r": 8, "lora.alpha": 16}
    return train_config(model, data, tmp_path / name, **{**base, **over})


def _scores(model, tok, texts, **kw) -> torch.Tensor:
    """The model's score of each text alone (no padding): the reward model's output, read directly."""
    with torch.no_grad():
        return torch.tensor([model(**tok(t, return_tensors="pt", **kw)).logits[0, 0].item() for t in texts])


def test_reward_full_loss_is_trls_and_the_run_folder_is_a_reward_model(tmp_path, tiny_model):
    import transformers
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    s = finetune.run(_cfg(tmp_path, tiny_model, method="full"))
    out = tmp_path / "out"
    losses = [json.loads(ln)["loss"] for ln in (out / "metrics.jsonl").read_text().splitlines()]
    assert s["steps"] == 2 and len(set(losses)) == 2  # it trained
    # Step 1's batch is the whole data (8 pairs) under the starting weights: the score head is drawn from the
    # run's seed, as finetune loads it (transformers.set_seed, then the model)
    transformers.set_seed(0)
    tok = AutoTokenizer.from_pretrained(tiny_model)
    start = AutoModelForSequenceClassification.from_pretrained(tiny_model, num_labels=1, dtype=torch.float32)
    start.config.pad_token_id = tok.pad_token_id
    rows = pref.rows("preference", n=8)
    chosen = _scores(start, tok, [r["prompt"] + r["chosen"] + tok.eos_token for r in rows])
    rejected = _scores(start, tok, [r["prompt"] + r["rejected"] + tok.eos_token for r in rows])
    assert losses[0] == pytest.approx(-torch.nn.functional.logsigmoid(chosen - rejected).mean().item(), rel=1e-5)

    rm = AutoModelForSequenceClassification.from_pretrained(out)
    assert rm.config.num_labels == 1 and rm.config.architectures == ["LlamaForSequenceClassification"]
    resolved = yaml.safe_load((out / "config.resolved.yaml").read_text())
    assert resolved["objective"] == "reward" and resolved["reward"] == {"center_rewards_coefficient": None}
    assert resolved["_resolved"]["reference_model"] == "none" and resolved["_resolved"]["data_format"] == "preference"


def test_reward_lora_then_grpo_takes_it_as_a_reward(tmp_path, tiny_model, monkeypatch):
    from peft import PeftConfig
    from transformers import AutoModelForSequenceClassification, AutoTokenizer
    from trl import GRPOTrainer

    finetune.run(_cfg(tmp_path, tiny_model, method="lora", name="rm", **{"output.save": "both"}))
    assert PeftConfig.from_pretrained(tmp_path / "rm").task_type == "SEQ_CLS"
    merged = tmp_path / "rm" / "merged"

    seen = []  # what TRL's GRPOTrainer computed, under the Toolbox's checks
    calc = GRPOTrainer._calculate_rewards

    def record(self, inputs, prompts, completions, completion_ids_list):
        r = calc(self, inputs, prompts, completions, completion_ids_list)
        seen.append((list(prompts), list(completions), r.detach().cpu().clone()))
        return r

    monkeypatch.setattr(GRPOTrainer, "_calculate_rewards", record)
    grpo = {"objective": "grpo", "method": "lora", "train.max_steps": 1, "grpo.num_generations": 4,
            "grpo.max_completion_length": 6, "grpo.rewards": [{"model": str(merged)}]}
    finetune.run(_cfg(tmp_path, tiny_model, kind="prompt", name="grpo", **grpo))
    prompts, completions, rewards = seen[0]
    rm = AutoModelForSequenceClassification.from_pretrained(merged, dtype=torch.float32)
    tok = AutoTokenizer.from_pretrained(merged)
    want = _scores(rm, tok, [p + c for p, c in zip(prompts, completions)], add_special_tokens=False)
    assert rewards.shape == (len(prompts), 1) and len(prompts) == 8
    assert rewards[:, 0] == pytest.approx(want, abs=1e-4)


@pytest.mark.parametrize("entry, says", [
    ("nowhere", "grpo.rewards.0.model: .*nowhere: no such folder"),
    ("causal", "grpo.rewards.0.model: .*not a reward model \\(architectures \\['LlamaForCausalLM'\\]"),
    ("adapter", "grpo.rewards.0.model: .*no config.json \\(a LoRA adapter: give its merged model"),
])
def test_a_reward_model_entry_that_is_none_is_refused_before_loading(tmp_path, tiny_model, entry, says):
    folder = {"nowhere": tmp_path / "nowhere", "causal": tiny_model, "adapter": tmp_path / "adapter"}[entry]
    if entry == "adapter":
        folder.mkdir()
        (folder / "adapter_config.json").write_text("{}")
    grpo = {"objective": "grpo", "grpo.rewards": [{"model": str(folder)}], "grpo.num_generations": 4}
    with pytest.raises(UserError, match=says):
        finetune.run(_cfg(tmp_path, tiny_model, kind="prompt", **grpo))
    assert not (tmp_path / "out").exists()  # nothing written


def test_a_reward_entry_names_a_function_or_a_model(tmp_path, tiny_model):
    both = {"objective": "grpo", "grpo.rewards": [{"model": "x", "function": "format", "pattern": "o"}]}
    with pytest.raises(UserError, match=r"grpo\.rewards\.0.*give function or model \(one of them\)"):
        finetune.run(_cfg(tmp_path, tiny_model, kind="prompt", **both))
