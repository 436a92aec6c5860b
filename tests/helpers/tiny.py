"""Tiny, random-init models, a locally trained tokenizer and small datasets for tests.

Nothing here touches a hub: the tokenizer is trained on a few sentences, the models
are built from configs, the datasets are written by the tests. Hidden size 32-64 and
2 layers keep a training step in milliseconds on 2 CPU cores.
"""

from __future__ import annotations

import csv
import json
import random
from pathlib import Path
from typing import Any

import yaml

# A small world of sentences a 2-layer model learns quickly (loss falls in a few steps).
_SUBJECTS = ["the cat", "a dog", "the bird", "my friend", "the robot", "a child"]
_VERBS = ["sees", "likes", "finds", "takes", "wants", "makes"]
_OBJECTS = ["the ball", "a red box", "some bread", "the blue car", "a small tree", "the moon"]

# The assistant's turns inside {% generation %} markers (as TRL's training templates have them), so
# assistant-only loss (data.train_on: responses) can find them; PLAIN_CHAT_TEMPLATE renders the same
# text without them (most models' shipped templates).
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{% if message['role'] == 'assistant' %}"
    "<|assistant|>{% generation %}{{ message['content'] }}<|end|>{% endgeneration %}\n"
    "{% else %}<|{{ message['role'] }}|>{{ message['content'] }}<|end|>\n{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
PLAIN_CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "<|{{ message['role'] }}|>{{ message['content'] }}<|end|>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)

SPECIAL_TOKENS = ["<pad>", "<s>", "</s>", "<unk>", "<|user|>", "<|assistant|>", "<|system|>",
                  "<|end|>", "<boi>", "<eoi>", "<image>"]


def _sentences(n: int, seed: int = 0) -> list[str]:
    rnd = random.Random(seed)
    return [f"{rnd.choice(_SUBJECTS)} {rnd.choice(_VERBS)} {rnd.choice(_OBJECTS)}." for _ in range(n)]


def make_tokenizer(dir: str | Path) -> Path:
    """Train a byte-level BPE tokenizer (~300 tokens) on local text and save it to `dir`."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    dir = Path(dir)
    dir.mkdir(parents=True, exist_ok=True)
    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=320,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    corpus = _sentences(400) + ["Instruction: Input: Response: user assistant system"] * 4
    tok.train_from_iterator(corpus, trainer=trainer)
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<s>",
        eos_token="</s>",
        pad_token="<pad>",
        unk_token="<unk>",
        model_max_length=256,
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(dir)
    return dir


def _tok_ids(dir: Path) -> dict[str, Any]:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(dir)
    ids = {t: tok.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS}
    return {"vocab_size": len(tok), "ids": ids}


ARCHS = ("llama", "qwen3", "gemma3", "gemma3-mm", "gpt-oss", "qwen3-moe")


def _config(arch: str, vocab: int, ids: dict[str, int], max_len: int):
    import transformers as tf

    common = dict(
        vocab_size=vocab,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=max_len,
        pad_token_id=ids["<pad>"],
        bos_token_id=ids["<s>"],
        eos_token_id=ids["</s>"],
    )
    if arch == "llama":
        return tf.LlamaConfig(**common, tie_word_embeddings=False), tf.LlamaForCausalLM
    if arch == "qwen3":
        return tf.Qwen3Config(**common, head_dim=8, tie_word_embeddings=False), tf.Qwen3ForCausalLM
    if arch in ("gemma3", "gemma3-mm"):
        text = tf.Gemma3TextConfig(**common, head_dim=8, sliding_window=32, query_pre_attn_scalar=8)
        if arch == "gemma3":
            return text, tf.Gemma3ForCausalLM
        # The multimodal wrapper (what Gemma 3 4B/12B/27B checkpoints are): a SigLIP tower
        # plus the text model; fine-tuning on text must still work.
        vision = tf.SiglipVisionConfig(
            hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
            image_size=28, patch_size=14,
        )
        cfg = tf.Gemma3Config(
            text_config=text.to_dict(),
            vision_config=vision.to_dict(),
            mm_tokens_per_image=4,
            boi_token_index=ids["<boi>"],
            eoi_token_index=ids["<eoi>"],
            image_token_index=ids["<image>"],
        )
        return cfg, tf.Gemma3ForConditionalGeneration
    if arch == "gpt-oss":
        cfg = tf.GptOssConfig(**common, head_dim=8, num_local_experts=4, num_experts_per_tok=2,
                              sliding_window=32)
        return cfg, tf.GptOssForCausalLM
    if arch == "qwen3-moe":  # experts PEFT 0.21 converts itself (v4 gate/up/down_proj -> fused parameters)
        cfg = tf.Qwen3MoeConfig(**common, head_dim=8, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16,
                                decoder_sparse_step=1, mlp_only_layers=[], tie_word_embeddings=False)
        return cfg, tf.Qwen3MoeForCausalLM
    raise ValueError(f"unknown arch {arch!r}; one of {', '.join(ARCHS)}")


def make_tiny_model(dir: str | Path, arch: str = "llama", max_len: int = 256, seed: int = 0) -> Path:
    """Build a random-init 2-layer model of `arch` with the local tokenizer, saved in `dir`."""
    import torch

    dir = Path(dir)
    make_tokenizer(dir)
    info = _tok_ids(dir)
    cfg, cls = _config(arch, info["vocab_size"], info["ids"], max_len)
    torch.manual_seed(seed)
    model = cls(cfg).to(torch.float32)
    model.save_pretrained(dir, safe_serialization=True)
    return dir


def _rows(fmt: str, n: int, seed: int) -> list[dict[str, Any]]:
    sents = _sentences(n, seed)
    rows = []
    for i, s in enumerate(sents):
        if fmt == "text":
            rows.append({"text": s})
        elif fmt == "alpaca":
            rows.append({"instruction": "Repeat the sentence.", "input": s, "output": s})
        elif fmt == "messages":
            rows.append({"messages": [
                {"role": "user", "content": f"say: {s}"},
                {"role": "assistant", "content": s},
            ]})
        else:
            raise ValueError(f"unknown format {fmt!r}; text, alpaca or messages")
    return rows


def write_dataset(path: str | Path, fmt: str = "text", n: int = 64, seed: int = 0) -> Path:
    """Write `n` rows of `fmt` to `path`; the suffix picks the file type (.jsonl, .parquet, .csv)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    rows = _rows(fmt, n, seed)
    suffix = path.suffix.lower()
    if suffix in (".jsonl", ".json"):
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    elif suffix == ".parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.Table.from_pylist(rows), path)
    elif suffix == ".csv":
        if fmt == "messages":
            raise ValueError("messages do not fit in CSV; use .jsonl or .parquet")
        with path.open("w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows(rows)
    else:
        raise ValueError(f"unknown dataset suffix {suffix!r}")
    return path


def _set_path(d: dict, dotted: str, value: Any) -> None:
    keys = dotted.replace("__", ".").split(".")
    for k in keys[:-1]:
        d = d.setdefault(k, {})
    d[keys[-1]] = value


def train_config(model_dir, data_path, output_dir, **overrides) -> dict[str, Any]:
    """A small, fast train config as a dict; `overrides` take dotted or `__` paths."""
    cfg: dict[str, Any] = {
        "model": {"path": str(model_dir)},
        "data": {"path": str(data_path), "max_seq_length": 32},
        "method": "full",
        "backend": "hf",
        "train": {
            "max_steps": 6,
            "per_device_batch_size": 4,
            "gradient_accumulation_steps": 1,
            "learning_rate": 5e-3,
            "lr_scheduler": "constant",
            "warmup_steps": 0,
            "precision": "fp32",
            "seed": 0,
            "gradient_checkpointing": False,
        },
        "output": {"dir": str(output_dir), "save_steps": 0, "progress_bar": False},
    }
    for k, v in overrides.items():
        _set_path(cfg, k, v)
    return cfg


def write_train_config(path, model_dir, data_path, output_dir, **overrides) -> Path:
    """Write `train_config(...)` as YAML to `path` (the file `finetune --config` reads)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(train_config(model_dir, data_path, output_dir, **overrides), sort_keys=False))
    return path


def lora_trainers(tmp_path, model_dir, base: dict, runs: dict, max_new_tokens: int | None = None):
    """(model, tokenizer, name -> trainer): each run's config (`base` with its overrides) resolved, preflighted and
    built as its objective's TRL trainer around ONE LoRA model (B random, so the adapter is no no-op at step 0),
    generating greedily (`max_new_tokens` as set, else the config's)."""
    from peft import LoraConfig, get_peft_model

    from helpers import pref
    from toolbox_train.planning import preflight
    from toolbox_train.planning.run import Dist, resolve
    from toolbox_train.training import loading
    from toolbox_train.units import registry

    prompts = pref.write(Path(tmp_path) / "g.jsonl", "prompt", 8)
    model = tok = None
    out = {}
    for name, over in runs.items():
        p = resolve(train_config(model_dir, prompts, Path(tmp_path) / str(name), **{**base, **over}), check_output=False)
        p, train_ds, _ = preflight.validate(p)
        if model is None:
            base_model, tok, _ = loading.load(p, Dist())
            tok.pad_token = tok.pad_token or tok.eos_token
            model = get_peft_model(base_model, LoraConfig(r=4, lora_alpha=8, target_modules="all-linear",
                                                          init_lora_weights=False))
        out[name] = t = registry.build(p, Dist(), model, tok, None, train_ds, None, [])
        t.generation_config.do_sample = False
        if max_new_tokens is not None:
            t.generation_config.max_new_tokens = max_new_tokens
    return model, tok, out
