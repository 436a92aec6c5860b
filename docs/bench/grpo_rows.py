"""Issue 32's GRPO generation share: what part of a GRPO step `finetune` spends inside generation
(transformers' `generate`, TRL 1.15's default), per step, on a random-init bench shape with LoRA.

    python docs/bench/grpo_rows.py OUT WORK [--shapes llama-1b,qwen3-0.6b] [--generation transformers,auto]
        [--repeats N]   (issue 41: N rounds, each shape's samplers in alternating order, one process a row)
    python docs/bench/grpo_rows.py OUT WORK --one SHAPE GENERATION   (one row; what the driver runs per process)

A GENERATION is [tools:][BACKEND:]SAMPLER[+nomerge], SAMPLER one of grpo.generation's (`compiled`: issue 46's
loop, generation/decode.py, timed under TRL's "transformers.generate" block name): BACKEND
(unsloth:transformers-static; plain ones run on hf), `+nomerge` sets grpo.merge_lora: false (auto, the
default, generates on the LoRA merged into a copy of the weights: generation/sampler.py merge; each row
records the resolved run's sampler, sampler_merged and sampler_merged_why), `tools:` makes it issue 46's
tool-calling row (docs/bench/grpo_tools_row.py: grpo.tools, the model's first turn scripted, its tool metrics
from metrics.jsonl under "tools"). The row keeps the name.

How it is timed: TRL 1.15 wraps its generation in `profiling_context` blocks ("transformers.generate",
or "vLLM.generate" and "sync_weights" in the vLLM modes) and its `_prepare_inputs` (generation,
rewards, advantages) in `profiling_decorator`; their durations go only to W&B / MLflow / Trackio,
never to the trainer's logs. This script wraps `trl.extras.profiling.ProfilingContext.__exit__`
(the device synchronized first) to record each block's time with its step, and a TrainerCallback
times each optimizer step (synchronized, end to end). With gradient accumulation 1, TRL generates
once per step (steps_per_generation = accumulation), so each timed step holds one generation.

Settings (environment): PROMPT 128 words (one token each: bench/synthetic's word-level tokenizer),
COMPLETION 256 tokens, GENS 8 completions per prompt, BATCH 16 completions a step (2 prompts),
WARMUP 2 + STEPS 8 timed, LoRA r16 on every projection, backend hf (or as the row names it), bf16 (fp32 on DEVICE=cpu).
A random-init model almost never samples its EOS id, so every completion runs the full COMPLETION
tokens: the workload is the same every step. The reward is the built-in length penalty with max_chars
COMPLETION (the decoded lengths vary, so the advantages are not all zero and the backward is a real one).
Rows go to OUT/grpo-rows.json and one `ROW {...}` line each on stdout; WORK holds the models. HOSTSPY=1 samples
each row's host over its timed steps with py-spy from another process (host_spy.py; `hostspy` in the row, raw
stacks in OUT/hostspy-SHAPE-GENERATION.txt).
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path

ENV = {k: int(os.environ.get(k, d)) for k, d in
       (("PROMPT", 128), ("COMPLETION", 256), ("GENS", 8), ("BATCH", 16), ("WARMUP", 2), ("STEPS", 8))}
DEVICE = os.environ.get("DEVICE", "cuda")
GENERATE = ("transformers.generate", "transformers.generate_batch", "vLLM.generate", "sync_weights")
PREPARE = "_prepare_inputs"


def _sync():
    if DEVICE == "cuda":
        import torch

        torch.cuda.synchronize()


def record_trl_timings(into: list) -> None:
    """Every TRL profiling block's (name, step it ran in, seconds), the device synchronized at the end of
    the generation blocks and of _prepare_inputs (they end in host reads of their results anyway)."""
    from trl.extras import profiling

    exit_ = profiling.ProfilingContext.__exit__

    def __exit__(self, *exc):
        name = self.name.split(".", 1)[1] if "." in self.name else self.name  # "<TrainerClass>.<block>"
        if name in GENERATE or name == PREPARE:
            _sync()
        if self._start_time is not None:
            into.append((name, (self.step or 0) + 1, time.perf_counter() - self._start_time))
        return exit_(self, *exc)

    profiling.ProfilingContext.__exit__ = __exit__


def slug(generation: str) -> str:
    """A row's GENERATION as a file name's part."""
    return generation.replace(':', '-').replace('+', '-')


def step_clock(times: dict, sampler: dict | None = None, spy=None):
    """A TrainerCallback: wall time of each optimizer step (previous step's end to this one's); `sampler`
    gets the GRPOConfig arguments that say which sampler ran (what grpo.generation resolved to); `spy` (HOSTSPY=1,
    host_spy.Spy) samples the host over the timed steps."""
    from transformers import TrainerCallback

    class Clock(TrainerCallback):
        last = None

        def on_train_begin(self, args, *a, **k):
            if sampler is not None:
                sampler.update({k: getattr(args, k, None) for k in (
                    "cache_implementation", "use_transformers_continuous_batching", "use_vllm")})
            _sync()
            Clock.last = time.perf_counter()

        def on_step_end(self, args, state, control, **k):
            if spy is not None and state.global_step == ENV["WARMUP"]:  # its start-up in the last warm-up step
                spy.start()
            _sync()
            t = time.perf_counter()
            times[state.global_step] = t - Clock.last
            Clock.last = t
            if spy is not None and state.global_step == ENV["WARMUP"] + ENV["STEPS"]:
                spy.stop()

    return Clock()


def _data(path: Path, vocab: int, n: int = 256) -> Path:
    rnd = random.Random(0)
    path.write_text("".join(json.dumps({"prompt": " ".join(f"w{rnd.randrange(4, min(vocab, 32768))}"
                                                           for _ in range(ENV["PROMPT"]))}) + "\n"
                            for _ in range(n)))
    return path


def parse(generation: str) -> tuple[str, str, bool, bool | None]:
    """GENERATION -> (backend, sampler, tools row, grpo.merge_lora or None to leave it unset):
    [tools:][BACKEND:]SAMPLER[+nomerge]."""
    tools = generation.startswith("tools:")
    spec, plus, flag = generation.removeprefix("tools:").partition("+")
    if plus and flag != "nomerge":
        raise SystemExit(f"GENERATION {generation!r}: the only suffix is +nomerge")
    backend, _, sampler = spec.rpartition(":")
    from toolbox_train.generation.sampler import MODES  # compiled (issue 46's loop) among them

    if sampler not in MODES:
        raise SystemExit(f"GENERATION {generation!r}: {sampler!r} is not a sampler ({', '.join(MODES)})")
    return backend or "hf", sampler, tools, (False if plus else None)


def one(out: Path, work: Path, shape: str, generation: str = "transformers") -> dict:
    backend, sampler_name, tools, merge_lora = parse(generation)
    from toolbox_train.bench.shapes import LORA_TARGETS
    from toolbox_train.bench.synthetic import build_model_dir
    from toolbox_train.commands import finetune

    model_dir = work / f"model-{shape}"
    if not tools and not model_dir.exists():
        build_model_dir(shape, model_dir, device=DEVICE)
    data = work / f"prompts-{shape}-{ENV['PROMPT']}.jsonl"
    if not tools and not data.exists():
        _data(data, json.loads((model_dir / "config.json").read_text())["vocab_size"])
    run_dir = work / f"run-{shape}-{slug(generation)}"
    cfg = {"model": {"path": str(model_dir)}, "objective": "grpo", "method": "lora", "backend": backend,
           "data": {"path": str(data), "max_seq_length": ENV["PROMPT"] + 8},
           "grpo": {"num_generations": ENV["GENS"], "max_completion_length": ENV["COMPLETION"],
                    "rewards": [{"function": "length", "max_chars": ENV["COMPLETION"]}]},
           "lora": {"r": 16, "alpha": 16, "dropout": 0.0, "target_modules": LORA_TARGETS},
           "train": {"max_steps": ENV["WARMUP"] + ENV["STEPS"], "per_device_batch_size": ENV["BATCH"],
                     "precision": "bf16" if DEVICE == "cuda" else "fp32", "lr_scheduler": "constant", "seed": 0},
           "output": {"dir": str(run_dir), "save_steps": 0, "logging_steps": 1, "progress_bar": False}}
    cfg["grpo"]["generation"] = sampler_name  # named even for transformers: the default is auto since issue 41
    if merge_lora is not None:  # left out otherwise: a code tree older than the key still runs the plain rows
        cfg["grpo"]["merge_lora"] = merge_lora
    config, prompt_tokens = cfg, ENV["PROMPT"]
    if tools:  # the user module sits beside the config: written as a file
        import yaml

        import grpo_tools_row

        cfg, folder, prompt_tokens = grpo_tools_row.setup(work, shape, DEVICE, cfg)
        config = folder / f"train-{run_dir.name}.yaml"
        config.write_text(yaml.safe_dump(cfg, sort_keys=False))
    blocks: list = []
    steps: dict = {}
    sampler: dict = {}
    record_trl_timings(blocks)
    spy = None
    if os.environ.get("HOSTSPY") == "1":  # py-spy over the timed steps (host_spy.py); a later repeat's overwrites
        from host_spy import Spy

        spy = Spy(out / f"hostspy-{shape}-{slug(generation)}.txt")
    finetune.run(config, overwrite=True, callbacks=[step_clock(steps, sampler, spy)])
    per_step = []
    for s in sorted(steps):
        gen = sum(d for n, st, d in blocks if st == s and n in GENERATE)
        prep = sum(d for n, st, d in blocks if st == s and n == PREPARE)
        per_step.append({"step": s, "step_s": round(steps[s], 4), "generate_s": round(gen, 4),
                         "prepare_inputs_s": round(prep, 4), "generate_share": round(gen / steps[s], 4)})
    timed = [r for r in per_step if r["step"] > ENV["WARMUP"]]
    total = sum(r["step_s"] for r in timed)
    gen = sum(r["generate_s"] for r in timed)
    prep = sum(r["prepare_inputs_s"] for r in timed)
    resolved = _resolved(run_dir) or {}
    row = {"shape": shape, "generation": generation, "sampler_args": sampler, "device": _device_name(),
           "backend": backend, "settings": dict(ENV, lora_r=16, backend=backend, method="lora",
                                                merge_lora=merge_lora, prompt_tokens=prompt_tokens),
           "sampler": resolved.get("sampler"), "sampler_merged": resolved.get("sampler_merged"),
           "sampler_merged_why": resolved.get("sampler_merged_why"),
           "timed_steps": len(timed), "step_s_mean": round(total / len(timed), 3),
           "generate_s_mean": round(gen / len(timed), 3), "generate_share": round(gen / total, 3),
           "generation_and_scoring_share": round(prep / total, 3),
           # decode positions: generate runs max_completion_length new tokens (a random-init model never stops)
           "generated_tokens_per_s": round(ENV["BATCH"] * ENV["COMPLETION"] * len(timed) / gen, 1) if gen else None,
           "blocks_seen": sorted({n for n, _, _ in blocks}), "per_step": per_step,
           "resolved": resolved or None,
           "versions": _versions()}
    if tools:
        row["tools"] = grpo_tools_row.metrics(run_dir, ENV["WARMUP"])
    if spy is not None:
        row["hostspy"] = spy.summary
    if DEVICE == "cuda":
        import torch

        row["peak_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
    return row


def _resolved(run_dir: Path) -> dict | None:
    """What finetune decided (gradient checkpointing, precision, ...): config.resolved.yaml's _resolved."""
    import yaml

    try:
        return yaml.safe_load((run_dir / "config.resolved.yaml").read_text()).get("_resolved")
    except (OSError, AttributeError):
        return None


def _device_name() -> str:
    if DEVICE != "cuda":
        return "cpu"
    import torch

    return torch.cuda.get_device_name(0)


def _versions() -> dict:
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for p in ("torch", "transformers", "trl", "peft", "accelerate", "vllm", "unsloth", "unsloth_zoo"):
        try:
            out[p] = version(p)
        except PackageNotFoundError:
            out[p] = None
    return out


def main(argv: list[str]) -> int:
    out, work = Path(argv[0]), Path(argv[1])
    out.mkdir(parents=True, exist_ok=True)
    work.mkdir(parents=True, exist_ok=True)
    if argv[2:3] == ["--one"]:
        print("ROW " + json.dumps(one(out, work, argv[3], *argv[4:5])), flush=True)
        return 0
    opt = dict(zip(argv[2::2], argv[3::2]))
    rows = []
    gens = opt.get("--generation", "transformers").split(",")
    for gen in gens:
        parse(gen)  # a misspelt row is one line before any row runs
    order = [(shape, gen, r) for r in range(int(opt.get("--repeats", 1)))
             for shape in opt.get("--shapes", "llama-1b,qwen3-0.6b").split(",")
             for gen in (gens if r % 2 == 0 else gens[::-1])]  # interleaved: each round flips the order
    for shape, gen, rep in order:
        cp = subprocess.run([sys.executable, __file__, str(out), str(work), "--one", shape, gen],
                            capture_output=True, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})
        (out / f"grpo-{shape}-{slug(gen)}-r{rep}.log").write_text(cp.stdout + cp.stderr)
        row = next((json.loads(x[4:]) for x in cp.stdout.splitlines() if x.startswith("ROW ")),
                   {"shape": shape, "generation": gen,
                    "error": (cp.stderr.strip().splitlines() or ["?"])[-1]})
        row["repeat"] = rep
        print(json.dumps({k: v for k, v in row.items() if k != "per_step"}), flush=True)
        rows.append(row)
        (out / "grpo-rows.json").write_text(json.dumps(rows, indent=2) + "\n")  # after each row: a cut run keeps its rows
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
