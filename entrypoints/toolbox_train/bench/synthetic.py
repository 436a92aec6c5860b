"""Model, tokenizer and data built locally: no hub, no download."""

from __future__ import annotations

import json
import random
from pathlib import Path

from toolbox_train.bench.shapes import SHAPES, SPECIAL_TOKENS
from toolbox_train.disk import atomic_write, publish_folder


def build_tokenizer(dest: Path, vocab_size: int):
    """A word-level tokenizer: word `w<i>` is token i, so a text of n words is n tokens."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    n = min(vocab_size, 32768)
    vocab = {t: i for i, t in enumerate(SPECIAL_TOKENS)}
    for i in range(len(SPECIAL_TOKENS), n):
        vocab[f"w{i}"] = i
    tk = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok = PreTrainedTokenizerFast(tokenizer_object=tk, unk_token="<unk>", bos_token="<s>",
                                  eos_token="</s>", pad_token="<pad>", model_max_length=1 << 20)
    tok.save_pretrained(dest)
    return tok


def build_model_dir(shape: str | dict, dest: Path, device: str = "cpu") -> Path:
    """Random-init model of `shape` (a name, or a config dict) in bf16 + tokenizer, saved as a local HF model folder."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    kw = dict(SHAPES[shape] if isinstance(shape, str) else shape)
    mt = kw.pop("model_type")
    cfg = AutoConfig.for_model(mt, bos_token_id=1, eos_token_id=2, pad_token_id=3, **kw)
    with publish_folder(dest) as tmp:
        torch.manual_seed(0)
        with torch.device(device):
            model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
        model.save_pretrained(tmp)
        build_tokenizer(tmp, cfg.vocab_size)
        del model
    return dest


def write_text_dataset(path: Path, n: int, words: int, vocab: int, seed: int = 0, motif: int = 64) -> Path:
    """JSONL of `text` rows of `words` word-tokens: a random motif repeated, so loss can fall (copying)."""
    rng = random.Random(seed)
    lo = len(SPECIAL_TOKENS)
    rows = []
    for _ in range(n):
        m = [f"w{rng.randrange(lo, vocab)}" for _ in range(motif)]
        rows.append(json.dumps({"text": " ".join((m * (words // motif + 1))[:words])}) + "\n")
    return atomic_write(path, "".join(rows))


def read_token_batches(path: str, batch: int, seq: int, n: int):
    """The dataset's rows as id tensors (word `w<i>` is id i), so bare loops train on the same data."""
    import torch

    rows = []
    with open(path) as f:
        for line in f:
            words = json.loads(line)["text"].split()[:seq]
            rows.append([int(w[1:]) for w in words])
            if len(rows) == batch * n:
                break
    if len(rows) < batch * n:
        raise RuntimeError(f"{path}: {len(rows)} rows, {batch * n} needed")
    return [torch.tensor(rows[i * batch:(i + 1) * batch]) for i in range(n)]
