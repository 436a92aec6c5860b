"""HF tokenizers built from llama.cpp's vendored vocabularies (models/ggml-vocab-*.gguf).

llama.cpp's converter recognises a BPE tokenizer by hashing its output on a fixed text, so a
test tokenizer must be a real one. These GGUF files hold real vocabularies (tokens, merges,
token types); the pre-tokenizer regexes below are those llama.cpp uses for each `tokenizer.ggml.pre`
(src/llama-vocab.cpp at the pinned commit). The converter's hash check and the vendored
.inp/.out token lists verify the result.
"""

from __future__ import annotations

import json
import mmap
import struct
from pathlib import Path

# gguf-py's GGUFReader builds a numpy view per array element (over a minute for a 128k vocab
# on 2 cores); the test needs only the key/value header, read here directly.
_SCALAR = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}


def read_kv(path: Path) -> dict:
    with open(path, "rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as m:
        if m[:4] != b"GGUF":
            raise ValueError(f"{path}: not a GGUF file")
        _, _, n_kv = struct.unpack_from("<IQQ", m, 4)
        off = 24

        def string():
            nonlocal off
            (n,) = struct.unpack_from("<Q", m, off)
            s = m[off + 8:off + 8 + n].decode("utf-8", errors="replace")
            off += 8 + n
            return s

        def value(t):
            nonlocal off
            if t == 8:
                return string()
            if t == 9:
                (it, n) = struct.unpack_from("<IQ", m, off)
                off += 12
                if it in _SCALAR:
                    fmt = "<" + _SCALAR[it] * n
                    vals = list(struct.unpack_from(fmt, m, off))
                    off += struct.calcsize(fmt)
                    return vals
                return [value(it) for _ in range(n)]
            fmt = "<" + _SCALAR[t]
            (v,) = struct.unpack_from(fmt, m, off)
            off += struct.calcsize(fmt)
            return v

        kv = {}
        for _ in range(n_kv):
            key = string()
            (t,) = struct.unpack_from("<I", m, off)
            off += 4
            kv[key] = value(t)
        return kv


# llama.cpp's regexes for the two BPE pre-tokenizers the tests use (LLAMA3 and QWEN2).
PRE_REGEX = {
    "llama-bpe": r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
                 r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
    "qwen2": r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
             r"|\s+(?!\S)|\s+",
}
CONTROL, USER_DEFINED = 3, 4

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "<|start_header_id|>{{ message['role'] }}<|end_header_id|>\n\n{{ message['content'] }}<|eot_id|>"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
)


def make_tokenizer(vocab_gguf: Path, dest: Path) -> Path:
    """Save an HF fast tokenizer equal to the GGUF's vocabulary into `dest`."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    kv = read_kv(vocab_gguf)
    pre = kv["tokenizer.ggml.pre"]
    if kv["tokenizer.ggml.model"] != "gpt2" or pre not in PRE_REGEX:
        raise ValueError(f"{vocab_gguf}: only BPE vocabularies of {', '.join(PRE_REGEX)}")
    tokens, types = kv["tokenizer.ggml.tokens"], kv["tokenizer.ggml.token_type"]
    merges = [tuple(m.split(" ", 1)) for m in kv["tokenizer.ggml.merges"]]
    bpe = models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges,
                     ignore_merges=pre == "llama-bpe", byte_fallback=False)
    tok = Tokenizer(bpe)
    if pre == "qwen2":
        tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(PRE_REGEX[pre]), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False)
                            for t, ty in zip(tokens, types) if ty in (CONTROL, USER_DEFINED)])
    bos = tokens[kv["tokenizer.ggml.bos_token_id"]]
    eos = tokens[kv["tokenizer.ggml.eos_token_id"]]
    if pre == "llama-bpe":
        bos_id = kv["tokenizer.ggml.bos_token_id"]
        tok.post_processor = processors.TemplateProcessing(
            single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, bos_id)])
    else:
        tok.post_processor = processors.ByteLevel(trim_offsets=False)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=bos, eos_token=eos, pad_token=eos,
                                   model_max_length=4096, clean_up_tokenization_spaces=False)
    fast.chat_template = kv.get("tokenizer.chat_template") or CHAT_TEMPLATE
    dest.mkdir(parents=True, exist_ok=True)
    fast.save_pretrained(dest)
    return dest


def check_against_vendored(tok_dir: Path, vocab_gguf: Path) -> int:
    """Tokenize the vendored .inp test strings; compare with the .out ids llama.cpp expects.
    Returns the number of strings checked; raises AssertionError on the first difference."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tok_dir)
    raw = Path(str(vocab_gguf) + ".inp").read_text()
    sep = "\n__ggml_vocab_test__\n"
    inp = raw.split(sep)
    if inp and inp[-1] == "":  # the C++ reader stops at the end after the last separator
        inp.pop()
    out = Path(str(vocab_gguf) + ".out").read_text().split("\n")[:len(inp)]
    n = 0
    for text, want in zip(inp, out):
        got = tok.encode(text, add_special_tokens=False)
        exp = [int(x) for x in want.split()]
        assert got == exp, f"{vocab_gguf.name}: {text!r}: {got} != {exp}"
        n += 1
    return n


if __name__ == "__main__":
    import sys

    d = make_tokenizer(Path(sys.argv[1]), Path(sys.argv[2]))
    print(json.dumps({"checked": check_against_vendored(d, Path(sys.argv[1]))}))
