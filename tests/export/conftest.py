"""Fixtures of the export tests: llama.cpp's tools (built once into a cache folder), real
vocabularies turned into HF tokenizers, tiny models on them, and runs fine-tuned a few steps."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

import llamacpp_build  # noqa: E402
import vocab  # noqa: E402
from exportkit import ARCH_VOCAB, CTX_LEN, finetune_run  # noqa: E402,F401



@pytest.fixture(scope="session")
def llama_tools() -> Path:
    if shutil.which("cmake") is None or shutil.which("c++") is None:
        pytest.fail("cmake and a C++ compiler are needed to build llama.cpp (.ci/apt-packages.txt)")
    return llamacpp_build.ensure_tools()


@pytest.fixture(scope="session")
def llama_source() -> Path:
    """llama.cpp's source tree, nothing built: the converter and the vendored vocabularies."""
    return llamacpp_build.ensure_source()


@pytest.fixture(scope="session")
def vocab_tokenizer(llama_source):
    """`vocab_tokenizer("llama-bpe")` -> folder of an HF tokenizer checked against llama.cpp's ids."""
    def get(name: str) -> Path:
        dest = llamacpp_build.ROOT / "tokenizers" / name
        if not (dest / "tokenizer.json").is_file():
            src = llama_source / "models" / f"ggml-vocab-{name}.gguf"
            tmp = dest.with_name(dest.name + ".partial")
            shutil.rmtree(tmp, ignore_errors=True)
            vocab.make_tokenizer(src, tmp)
            vocab.check_against_vendored(tmp, src)
            shutil.rmtree(dest, ignore_errors=True)
            tmp.rename(dest)
        return dest

    return get


@pytest.fixture(scope="session")
def real_vocab_model(vocab_tokenizer, tmp_path_factory):
    """`real_vocab_model("qwen3")` -> a random-init 2-layer model with a real tokenizer."""
    cache: dict[str, Path] = {}

    def get(arch: str) -> Path:
        if arch not in cache:
            import torch
            from transformers import AutoTokenizer

            from helpers.tiny import _config

            d = tmp_path_factory.mktemp(f"rv-{arch}")
            tok_dir = vocab_tokenizer(ARCH_VOCAB[arch])
            tok = AutoTokenizer.from_pretrained(tok_dir)
            ids = {"<pad>": tok.pad_token_id, "<s>": tok.bos_token_id, "</s>": tok.eos_token_id}
            cfg, cls = _config(arch, len(tok), ids, CTX_LEN)
            torch.manual_seed(0)
            cls(cfg).to(torch.float32).save_pretrained(d, safe_serialization=True)
            tok.save_pretrained(d)
            cache[arch] = d
        return cache[arch]

    return get


@pytest.fixture(scope="session")
def real_vocab_run(real_vocab_model, tmp_path_factory):
    """`real_vocab_run("llama")` -> a LoRA run (a few steps, 10% held out) on the real-vocab model."""
    cache: dict[str, Path] = {}

    def get(arch: str) -> Path:
        if arch not in cache:
            cache[arch] = finetune_run(real_vocab_model(arch), tmp_path_factory.mktemp(f"run-{arch}") / "run",
                                       **{"data.eval_split": 0.25})
        return cache[arch]

    return get
