"""Vision-language SFT rows (issues 40, 44): `finetune` on each backend and method against the references a user
would pick, on random-init models of Gemma-3-4B's, Qwen2.5-VL-7B's and Qwen3-VL-8B's shapes (the whole vision
tower, 4 text layers) with images at the family's default resolution; tokens/s over the timed steps, peak
memory, and the memory planner's prediction beside the measured peak.

    python docs/bench/vision_rows.py OUT [--shapes gemma3-4b-4l,...] [--paths "finetune bare trl unsloth-recipe"]
    python docs/bench/vision_rows.py OUT --one SHAPE PATH     (one row; what the driver runs per process)

PATH: `finetune[:BACKEND[:METHOD[:key=value,...]]]` (train.* keys, output.KEY, and the variants of
vision_variants.py: fused_images=1, nonblocking=1, liger_tower=false, compile_tower=1|cudagraphs; BACKEND auto|hf|unsloth, METHOD lora|qlora),
`bare[:train][:autocast][:prefetch2][:qlora]` (HF + PEFT + AdamW in a loop over a DataLoader with 4 workers, pinned
memory and the toolbox's collation; vision_refs.bare_row says what the options change), `trl[:qlora]` (TRL's SFTTrainer on the processor, its own vision collator), `unsloth-recipe`
(FastVisionModel + UnslothVisionDataCollator + TRL's SFTTrainer, as Unsloth's vision notebooks set it up).
Every row: LoRA r16 (alpha 32, no dropout) on the language model's linear layers, batch 4, bf16, no
gradient checkpointing, constant learning rate, lengths padded to 64 (vision_refs.PAD), 4 steps then 16 timed; its own process with an empty CUDA
kernel cache (CUDA_CACHE_PATH), so each pays its first-run kernel builds as a user's first run does.
SHAPE `tiny*` runs the same code on CPU in seconds (how the script is checked before a device call); `gemma3-cpu`
(Gemma 3's layers at CPU size) and `gemma3-cpu-deep` (its layer counts, narrow: host time) are for PROFILE=1 on
a CPU. VR_PRECISION (bf16|fp32) overrides the device's.
Rows go to OUT/vision-rows.json and one line each on stdout; models, data and run folders to VR_WORK (default OUT).
MEMTRACE=1 adds each Trainer row's peak of steps 1-2 by allocation site (vision_clock.peak_sites); ROW_TIMEOUT bounds a row.
PROFILE=1 runs torch.profiler over steps 3-4 of every row (after MEMTRACE's, before the timed ones: timings untouched)
and adds `profile` (step_profile.py: wall and GPU-busy seconds, top kernels and ops, cast and sync counts) to the row; the
full tables go to OUT/profile-SHAPE-PATH.txt (every op's count and times in .json; PROFILE_STACKS=1 adds each host
sync's call site, at a Python tracer's cost in the profiled steps). HOSTSPY=1 samples the host over the timed steps from
another process (host_spy.py: py-spy) and adds `hostspy`. Every row says its attention implementations (`attn`).

This file owns the shapes (their models and data), finetune's rows and the driver (one process a row); beside it,
vision_clock.py every row's settings and the Trainer rows' clock (MEMTRACE, PROFILE's profiler), vision_refs.py the
reference rows (bare, trl, unsloth-recipe), vision_variants.py finetune's variants, step_profile.py PROFILE=1's tables,
host_spy.py HOSTSPY=1's sampler.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "entrypoints"), str(Path(__file__).resolve().parent)]

import vision_clock  # noqa: E402  (PROF: set here in one(), read there by the clock and the bare loop)
from vision_clock import BATCH, LR, R, TIMED, WARMUP, Clock, _peak  # noqa: E402  (every row's settings)
from vision_refs import bare_row, trl_row, unsloth_row  # noqa: E402  (the reference rows)

ROWS = 96  # the data's rows
GEMMA_TEXT = dict(hidden_size=2560, intermediate_size=10240, num_attention_heads=8, num_key_value_heads=4,
                  head_dim=256, vocab_size=262208, sliding_window=1024, query_pre_attn_scalar=256,
                  max_position_embeddings=32768)
SIGLIP = dict(hidden_size=1152, intermediate_size=4304, num_hidden_layers=27, num_attention_heads=16,
              image_size=896, patch_size=14, vision_use_head=False)
QWEN_TEXT = dict(hidden_size=3584, intermediate_size=18944, num_attention_heads=28, num_key_value_heads=4,
                 vocab_size=152064, max_position_embeddings=32768)
QWEN_VISION = dict(depth=32, hidden_size=1280, intermediate_size=3420, num_heads=16, out_hidden_size=3584,
                   patch_size=14, spatial_merge_size=2, temporal_patch_size=2, window_size=112,
                   fullatt_block_indexes=[7, 15, 23, 31])
QWEN3_TEXT = dict(hidden_size=4096, intermediate_size=12288, num_attention_heads=32, num_key_value_heads=8,
                  head_dim=128, vocab_size=151936, max_position_embeddings=32768)
QWEN3_VISION = dict(depth=27, hidden_size=1152, intermediate_size=4304, num_heads=16, out_hidden_size=4096,
                    patch_size=16, spatial_merge_size=2, temporal_patch_size=2, num_position_embeddings=2304,
                    deepstack_visual_indexes=[8, 16, 24])
SHAPES = {  # name -> (family, text layers, image side in pixels, data.max_seq_length)
    # data.max_seq_length 384: the rows are 294-322 tokens (batches padded to 320 or 384), so the plan's batch of
    # max_seq_length tokens is the longest batch the run sees and its prediction is comparable with the peak
    "gemma3-4b-4l": ("gemma3", 4, 896, 384), "qwen2.5-vl-7b-4l": ("qwen2.5-vl", 4, 448, 384),
    "qwen3-vl-8b-4l": ("qwen3-vl", 4, 448, 384),
    "tiny": ("gemma3", 2, 28, 128), "tiny-qwen2.5-vl": ("qwen2.5-vl", 2, 56, 128),
    "tiny-qwen3-vl": ("qwen3-vl", 2, 64, 128),
    "gemma3-cpu": ("gemma3", 2, 224, 384),  # Gemma 3's layer kinds at CPU size: PROFILE=1 op tables on a CPU
    "gemma3-cpu-deep": ("gemma3", 4, 224, 384),  # gemma3-4b's layer counts, narrow: a step's host (launch) time
}
# the CPU shapes' text and tower dimensions that differ from gemma3-4b's (the 256 image tokens kept)
SMALL = {"gemma3-cpu": (dict(hidden_size=512, intermediate_size=2048, num_attention_heads=2, num_key_value_heads=1,
                             vocab_size=32768), dict(num_hidden_layers=2, image_size=224)),
         "gemma3-cpu-deep": (dict(hidden_size=64, intermediate_size=128, num_attention_heads=2, num_key_value_heads=1,
                                  head_dim=32, query_pre_attn_scalar=32, vocab_size=1024),
                             dict(hidden_size=64, intermediate_size=128, num_attention_heads=2, image_size=224))}
# The published models' multimodal rotary sections (halves of a 128-wide head); the tiny model's [1, 1, 2]
# fits only its 8-wide head (kept, Qwen2.5-VL's rotary embedding fails on the first step).
MROPE = {"qwen2.5-vl": [16, 24, 24], "qwen3-vl": [24, 20, 20]}


def _text_dims(family: str) -> dict:
    return {"qwen2.5-vl": QWEN_TEXT, "qwen3-vl": QWEN3_TEXT}.get(family, GEMMA_TEXT)


def make_model(shape: str, folder: Path) -> Path:
    """The shape's random-init model (bf16) with its processor, saved once into `folder`."""
    if (folder / "config.json").is_file():
        return folder
    import torch

    from tests.helpers import tiny_vision

    family, layers, side, _ = SHAPES[shape]
    if shape.startswith("tiny"):
        tiny_vision.make_tiny_vlm(folder, family, depth=1 if family == "gemma3" else 2)
        if family != "gemma3":  # the image at `side` pixels: the tiny processor's budget is one 28 px image
            import transformers as tf

            tf.AutoProcessor.from_pretrained(folder, min_pixels=side * side, max_pixels=side * side).save_pretrained(folder)
        return folder
    import transformers as tf

    cfg, proc = make_config(shape, folder)
    with torch.device("cuda" if torch.cuda.is_available() else "cpu"):
        model = tf.AutoModelForImageTextToText.from_config(cfg, dtype=torch.bfloat16)
    model.save_pretrained(folder, safe_serialization=True)
    proc.save_pretrained(folder)
    return folder


def make_config(shape: str, folder: Path):
    """The shape's config and processor (the tiny model's tokenizer, processor and chat template, widened), the
    tiny model saved in `folder` with them; what the memory plan reads (tests/train/test_vision_plan.py)."""
    from tests.helpers import tiny_vision

    family, layers, side, _ = SHAPES[shape]
    tiny_vision.make_tiny_vlm(folder, family)  # tokenizer, processor and chat template at the tiny size
    import transformers as tf

    cfg = tf.AutoConfig.from_pretrained(folder)
    if family == "gemma3":
        text = {k: v for k, v in cfg.text_config.to_dict().items() if k != "layer_types"}  # remade for `layers`
        small_text, small_vision = SMALL.get(shape, ({}, {}))
        text = {**text, **GEMMA_TEXT, "num_hidden_layers": layers, **small_text}
        cfg = tf.Gemma3Config(text_config=text, vision_config={**cfg.vision_config.to_dict(), **SIGLIP, **small_vision},
                              mm_tokens_per_image=256, boi_token_index=cfg.boi_token_index,
                              eoi_token_index=cfg.eoi_token_index, image_token_index=cfg.image_token_index)
        proc = tf.AutoProcessor.from_pretrained(folder)
        proc.image_processor.size = {"height": side, "width": side}
        proc.image_seq_length = 256  # saved, and the image's token run rebuilt from it when loaded
    else:
        text = {k: v for k, v in cfg.text_config.to_dict().items() if k != "layer_types"}
        rope = {**text.get("rope_parameters", {}), "mrope_section": MROPE[family]}
        text = {**text, **_text_dims(family), "num_hidden_layers": layers, "rope_parameters": rope}
        vision = QWEN_VISION if family == "qwen2.5-vl" else QWEN3_VISION
        cfg = type(cfg)(text_config=text, vision_config={**cfg.vision_config.to_dict(), **vision},
                        image_token_id=cfg.image_token_id, video_token_id=cfg.video_token_id,
                        vision_start_token_id=cfg.vision_start_token_id, vision_end_token_id=cfg.vision_end_token_id)
        proc = tf.AutoProcessor.from_pretrained(folder, min_pixels=side * side, max_pixels=side * side)
        proc.image_processor.patch_size = vision["patch_size"]  # the tiny processor's is 14: Qwen3-VL's tower takes 16
    return cfg, proc


def make_data(path: Path, side: int) -> Path:
    from tests.helpers.tiny_vision import COLOURS, _sentences

    import random

    from PIL import Image

    rnd = random.Random(0)
    (path.parent / "images").mkdir(parents=True, exist_ok=True)
    rows = []
    for i, s in enumerate(_sentences(ROWS, 0)):
        colour = rnd.choice(sorted(COLOURS))
        Image.new("RGB", (side, side), COLOURS[colour]).save(path.parent / "images" / f"{i}.png")
        rows.append({"messages": [
            {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "describe the picture"}]},
            {"role": "assistant", "content": [{"type": "text", "text": f"{colour}. {s} {s}"}]}],
            "images": [f"images/{i}.png"]})
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def finetune_row(model: Path, data: Path, out: Path, precision: str, seq: int, spec: list[str]) -> dict:
    """finetune as a user runs it: `spec` = [backend, method, key=value,...] (train.* keys, or output.KEY; defaults
    auto, lora)."""
    from toolbox_train.commands import finetune

    backend = spec[0] if spec else "auto"
    method = spec[1] if len(spec) > 1 else "lora"
    extra, output = {}, {}
    for kv in (spec[2].split(",") if len(spec) > 2 and spec[2] else []):
        k, v = kv.split("=", 1)
        if k.startswith("output."):  # output.logging_steps=4: a host sync at every 4th step, not every step
            output[k[len("output."):]] = __import__("yaml").safe_load(v)
        else:
            extra[k] = __import__("yaml").safe_load(v)
    cfg = {"model": {"path": str(model)}, "data": {"path": str(data), "max_seq_length": seq}, "method": method,
           "backend": backend, "lora": {"r": R, "alpha": 2 * R, "dropout": 0.0}, "vision": {"train": ["language"]},
           "train": {"max_steps": WARMUP + TIMED, "per_device_batch_size": BATCH, "learning_rate": LR,
                     "lr_scheduler": "constant", "warmup_steps": 0, "precision": precision,
                     "gradient_checkpointing": False, "seed": 0, **extra},
           "output": {"dir": str(out), "save_steps": 0, "progress_bar": False, "save": "adapter", **output}}
    every = output.get("logging_steps", 1)
    why = ("a whole number of steps, 1 or more" if type(every) is not int or every < 1 else
           # the timed tokens are metrics.jsonl's count at both ends
           f"the warm-up steps ({WARMUP}) and warm-up + VR_TIMED ({WARMUP + TIMED}) must be logged steps "
           "(multiples of it)" if WARMUP % every or (WARMUP + TIMED) % every else None)
    if why:  # one line and exit 2, before the run
        print(f"output.logging_steps={every}: {why}", file=sys.stderr)
        raise SystemExit(2)
    from vision_variants import apply_variants

    extra_callbacks = apply_variants(cfg["train"])  # fused_images, nonblocking, liger_tower, compile_tower
    clock = Clock()
    finetune.run(cfg, overwrite=True, callbacks=[clock.callback(), *extra_callbacks])
    steps = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    by_step = {s["step"]: s for s in steps if "tokens" in s}
    tokens = by_step[WARMUP + TIMED]["tokens"] - by_step[WARMUP]["tokens"]
    resolved = __import__("yaml").safe_load((out / "config.resolved.yaml").read_text())["_resolved"]
    return {**clock.row(tokens), "peak_gib": _peak(), "planned_gib": resolved.get("predicted_peak_gib"),
            "resolved": {k: resolved.get(k) for k in ("backend", "liger", "lm_head_kernel", "per_device_batch_size")
                         if k in resolved},
            "losses": [round(s["loss"], 4) for s in steps if "loss" in s][:WARMUP + TIMED]}


def _slug(path: str) -> str:
    return path.replace(':', '-').replace(',', '-').replace('=', '')


def one(out: Path, shape: str, path: str) -> dict:
    import torch

    if os.environ.get("PROFILE") == "1":  # its table beside the row's log, in what a device call returns
        from step_profile import StepProfiler  # beside this file, on sys.path from the top

        vision_clock.PROF = StepProfiler(out / f"profile-{shape}-{_slug(path)}.txt")
    if os.environ.get("HOSTSPY") == "1":  # py-spy over the timed steps, its raw stacks beside the row's log
        from host_spy import Spy

        vision_clock.SPY = Spy(out / f"hostspy-{shape}-{_slug(path)}.txt")
    precision = os.environ.get("VR_PRECISION") or ("bf16" if torch.cuda.is_available() else "fp32")
    out = Path(os.environ.get("VR_WORK", out))  # models, data and runs (VR_WORK: kept out of what a device call returns)
    model = make_model(shape, out / f"model-{shape}")
    data = make_data(out / f"data-{shape}" / "train.jsonl", SHAPES[shape][2])
    t0 = time.time()
    seq = SHAPES[shape][3]
    kind, *spec = path.split(":")
    run = out / f"run-{shape}-{_slug(path)}"
    if kind == "finetune":
        row = finetune_row(model, data, run, precision, seq, spec)
    elif kind == "bare":
        row = bare_row(model, data, precision, seq, tuple(spec))
    elif kind == "trl":
        row = trl_row(model, data, run, precision, seq, tuple(spec))
    elif kind == "unsloth-recipe":
        row = unsloth_row(model, data, run, precision, seq, *(spec or ["lora"]))
    else:
        raise SystemExit(f"unknown path {path}")
    return {"shape": shape, "path": path, "precision": precision, "batch": BATCH, "warmup_steps": WARMUP,
            "timed_steps": TIMED, "wall_s": round(time.time() - t0, 1), **row,
            **({"profile": vision_clock.PROF.summary} if vision_clock.PROF else {}),
            **({"hostspy": vision_clock.SPY.summary} if vision_clock.SPY else {})}


def in_process(script: str, out: Path, shape: str, key: str, name: str, log: Path, env: dict) -> dict:
    """`script OUT --one SHAPE NAME` in its own process (stderr to `log`): its row, the last line it prints, or
    an error row naming the log."""
    with open(log, "w") as f:
        try:
            r = subprocess.run([sys.executable, script, str(out), "--one", shape, name], stdout=subprocess.PIPE,
                               stderr=f, text=True, env=env, timeout=float(os.environ.get("ROW_TIMEOUT", 240)))
        except subprocess.TimeoutExpired as exc:  # one stuck row must not take the call's other rows with it
            return {"shape": shape, key: name, "error": f"over {exc.timeout:.0f} s, see {log.name}"}
    if r.returncode == 0 and r.stdout.strip():
        return json.loads(r.stdout.strip().splitlines()[-1])
    return {"shape": shape, key: name, "error": f"exit {r.returncode}, see {log.name}"}


def main(argv: list[str]) -> int:
    out = Path(argv[0])
    if "--one" in argv:
        from toolbox_train.contract import UserError

        out.mkdir(parents=True, exist_ok=True)
        i = argv.index("--one")
        try:
            print(json.dumps(one(out, argv[i + 1], argv[i + 2])))
        except UserError as exc:  # a row's finetune config refused (a bad key=value): its line, not a traceback
            print(f"vision_rows: {argv[i + 2]}: {exc}", file=sys.stderr)
            return 2
        return 0
    opt = dict(zip(argv[1::2], argv[2::2]))
    kinds = ("finetune", "bare", "trl", "unsloth-recipe")
    shapes = opt.get("--shapes", "gemma3-4b-4l,qwen2.5-vl-7b-4l,qwen3-vl-8b-4l").split(",")
    paths = opt.get("--paths", "finetune bare trl unsloth-recipe").split(" ")
    bad = [f"--shapes {s}: not one of {', '.join(SHAPES)}" for s in shapes if s not in SHAPES] + \
          [f"--paths {p}: a path starts with one of {', '.join(kinds)}" for p in paths if p.split(":")[0] not in kinds]
    if bad:  # before any row runs or anything is written
        print(f"vision_rows: {bad[0]}", file=sys.stderr)
        return 2
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    done = out / "vision-rows.json"
    if done.is_file():
        rows = json.loads(done.read_text())
    for shape in shapes:
        for path in paths:
            log = out / f"{shape}-{_slug(path)}.log"
            # an empty CUDA kernel cache each: no row runs on kernels an earlier row compiled
            env = {**os.environ, "PYTHONUNBUFFERED": "1", "CUDA_CACHE_PATH": tempfile.mkdtemp(prefix="cuda-cache-")}
            row = in_process(__file__, out, shape, "path", path, log, env)
            rows.append(row)
            brief = {k: v for k, v in row.items() if k not in ("losses", "profile")}
            if row.get("profile"):  # its seconds only: the tables are in the row's json and profile-*.txt
                brief["profile"] = {k: v for k, v in row["profile"].items() if k.endswith("_s")}
            print(json.dumps(brief), flush=True)
            done.write_text(json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
