"""Issue 46's tool-calling GRPO row (docs/bench/grpo_rows.py, GENERATION `tools:SAMPLER`): `finetune` with
`grpo.tools` (a tiny `add(a, b)` from a user module written into WORK) on a random-init model of a bench
shape's dimensions (bench/shapes.py) with a small byte-level BPE tokenizer carrying TRL's copy of Qwen3's chat
template (tests/helpers/tiny.py's make_tokenizer, as tests/train/test_grpo_tools.py's `tool_model`: nothing
from a hub; vocab ~320 instead of the shape's, the rest of the shape as it is).

What is scripted, and why: the model's FIRST turn. A random-init model never writes
`<tool_call>{"name": "add", ...}</tool_call>`, so TRL's `_generate_single_turn` is patched (in this row's own
process only) to return that text for a sequence whose prompt holds no tool result yet; the scripted turn
does no generation and is not in the timed generate blocks. Everything after it is real: TRL parses the
call, runs `add` (a Python call inside TRL's tool loop), appends its result to the conversation, and the
model generates its next turn (up to max_completion_length new tokens, as TRL asks generate for; whatever
runs past the completion budget is cut afterwards), the reward scores the whole conversation, the step
trains. Prompts are one fixed question (the same length every step, so a static cache compiles once); the
rendered prompt (system block with the tool's schema) is `prompt_tokens` long (720 with this tokenizer). The
call and the tool result take 158 tokens of max_completion_length (overhead(); COMPLETION 256: 98 of the
model's own are kept), but generate still decodes max_completion_length new tokens for the turn after the
tool, so the generate work is the other rows'; the step also holds the tool call and the longer prompts. Even-numbered completions
of a batch call add(2, 3), odd ones add(a=2) (a TypeError TRL counts as a failed call), so tools/failures
is 8 of 16 by construction.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

PROMPT = "What is 2 plus 3? Use the add tool."
MODULE = "bench_agent"
AGENT = '''"""Issue 46 bench: the tool and the reward (grpo.tools, grpo.rewards)."""


def add(a: int, b: int) -> int:
    """Adds two integers.

    Args:
        a: the first integer
        b: the second integer
    """
    return a + b


def used_the_tool(prompts, completions, **kw):
    """The whole conversation: 1 where add's result (5) came back, plus the length of the model's own
    last turn / 1000 (random-init text lengths differ, so the advantages are not all zero)."""
    out = []
    for c in completions:
        got = any(m["role"] == "tool" and m["content"] == "5" for m in c)
        last = c[-1]["content"] if c and c[-1]["role"] == "assistant" else ""
        out.append((1.0 if got else 0.0) + min(len(last or ""), 1000) / 1000)
    return out
'''


def call_text(i: int) -> str:
    args = {"a": 2, "b": 3} if i % 2 == 0 else {"a": 2}
    return f'<tool_call>\n{json.dumps({"name": "add", "arguments": args})}\n</tool_call><|im_end|>'


def build_model(shape: str, dest: Path, device: str) -> Path:
    """Random-init bf16 model of `shape`'s dimensions with the Qwen3-template tokenizer's vocab, in `dest`."""
    import torch
    import trl
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))
    from helpers.tiny import make_tokenizer  # the tests' tokenizer: trained here on a few sentences

    from toolbox_train.bench.shapes import SHAPES
    from toolbox_train.disk import publish_folder

    with publish_folder(dest) as tmp:
        make_tokenizer(tmp)
        tok = AutoTokenizer.from_pretrained(tmp)
        tok.chat_template = (Path(trl.__file__).parent / "chat_templates" / "qwen3.jinja").read_text()
        tok.model_max_length = 1 << 20
        tok.save_pretrained(tmp)
        kw = dict(SHAPES[shape], vocab_size=len(tok))
        cfg = AutoConfig.for_model(kw.pop("model_type"), bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                                   pad_token_id=tok.pad_token_id, **kw)
        torch.manual_seed(0)
        with torch.device(device):
            model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
        model.save_pretrained(tmp)
        del model
    return dest


def prompt_tokens(model_dir: Path) -> int:
    """The rendered prompt's length: system block with add's schema, the question, the assistant header."""
    from transformers import AutoTokenizer

    ns: dict = {}
    exec(AGENT, ns)
    tok = AutoTokenizer.from_pretrained(model_dir)
    return len(tok.apply_chat_template([{"role": "user", "content": PROMPT}], tools=[ns["add"]],
                                       add_generation_prompt=True, tokenize=True, return_dict=True)["input_ids"])


def overhead(model_dir: Path) -> int:
    """Tokens of the completion budget the scripted call (with its EOS) and the tool result (Qwen3's
    template: the turn closed, a user turn holding <tool_response>, the assistant header) take."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    suffix = "<|im_end|>\n<|im_start|>user\n<tool_response>\n5\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
    return max(len(tok(call_text(i) + suffix, add_special_tokens=False)["input_ids"]) + 1 for i in (0, 1))


def setup(work: Path, shape: str, device: str, cfg: dict) -> tuple[dict, Path, int]:
    """`cfg` (a grpo_rows config) turned into the tool row's: its model, data, tool, reward; the folder
    the config is written to (the user module beside it); the prompt's length. Scripts the first turn."""
    model_dir = work / f"tool-model-{shape}"
    if not model_dir.exists():
        build_model(shape, model_dir, device)
    folder = work / f"tools-{shape}"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{MODULE}.py").write_text(AGENT)
    data = folder / "prompts.jsonl"
    data.write_text("".join(json.dumps({"prompt": [{"role": "user", "content": PROMPT}]}) + "\n" for _ in range(64)))
    n = prompt_tokens(model_dir)
    need = overhead(model_dir)
    if cfg["grpo"]["max_completion_length"] < need + 16:
        raise SystemExit(f"COMPLETION {cfg['grpo']['max_completion_length']}: the scripted call and add's result "
                         f"take {need} tokens of the completion budget; give the tool row at least {need + 16}")
    cfg["model"]["path"] = str(model_dir)
    cfg["data"] = {"path": str(data), "max_seq_length": n + 8}
    cfg["grpo"].update(tools=[f"{MODULE}:add"], max_tool_calling_iterations=1,
                       rewards=[{"function": f"{MODULE}:used_the_tool"}])
    script_first_turn()
    return cfg, folder, n


def script_first_turn() -> None:
    """TRL's generation of a sequence whose prompt holds no tool result yet returns the template's
    tool-call text (call_text); later turns are the model's own (tests/train/test_grpo_tools.py _script).
    Scripted where each sampler's turn is: TRL's own `_generate_single_turn`, and the compiled loop's
    override of it (generation/trainer.py CompiledLoop), which does not call TRL's."""
    from trl import GRPOTrainer

    owners = [GRPOTrainer]
    try:
        from toolbox_train.generation.trainer import CompiledLoop

        owners.append(CompiledLoop)
    except ImportError:  # a code tree from before the compiled loop
        pass
    for owner in owners:
        owner._generate_single_turn = _scripted(owner._generate_single_turn)


def _scripted(real):
    def scripted(self, prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False):
        texts = self.processing_class.batch_decode(prompt_ids)
        if all("<tool_response>" in t for t in texts):
            return real(self, prompt_ids, images, multimodal_fields, num_generations, has_tool_images)
        if any("<tool_response>" in t for t in texts):
            raise RuntimeError("a batch mixing first and later turns: the script expects whole batches")
        eos = self.processing_class.eos_token_id
        return [self.processing_class(call_text(i), add_special_tokens=False)["input_ids"] + [eos]
                for i in range(len(texts))], None

    return scripted


TOOL_KEYS = ("tools/calls", "tools/failures", "tools/turns", "tools/max_turns", "tools/call_frequency",
             "tools/failure_frequency", "completions/mean_length", "reward")


def metrics(run_dir: Path, warmup: int) -> dict:
    """What finetune logged per step about the tools (metrics.jsonl): per timed step and their means."""
    try:
        rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x.strip()]
    except OSError:
        return {"error": "no metrics.jsonl"}
    timed = [r for r in rows if r.get("step", 0) > warmup and "tools/calls" in r]
    per_step = [{"step": r["step"], **{k: r.get(k) for k in TOOL_KEYS}} for r in timed]
    mean = {k: round(sum(r[k] for r in timed) / len(timed), 3) for k in TOOL_KEYS
            if timed and all(isinstance(r.get(k), (int, float)) for r in timed)}
    if not mean.get("tools/calls"):  # the row would time plain generation under the tool row's name
        return {"error": "no tool call in the timed steps: the scripted first turn did not run", "mean": mean,
                "per_step": per_step}
    return {"mean": mean, "per_step": per_step}
