"""Vision-language SFT rows (issues 40, 44): `finetune` on each backend and method against the references a user
would pick, on random-init models of Gemma-3-4B's, Qwen2.5-VL-7B's and Qwen3-VL-8B's shapes (the whole vision
tower, 4 text layers) with images at the family's default resolution; tokens/s over the timed steps, peak
memory, and the memory planner's prediction beside the measured peak.

    python docs/bench/vision_rows.py OUT [--shapes gemma3-4b-4l,...] [--paths "finetune bare trl unsloth-recipe"]
    python docs/bench/vision_rows.py OUT --one SHAPE PATH     (one row; what the driver runs per process)

PATH: `finetune[:BACKEND[:METHOD[:key=value,...]]]` (train.* keys, output.KEY, and the variants of
vision_variants.py: fused_images=1, nonblocking=1, liger_tower=false, compile_tower=1|cudagraphs; BACKEND auto|hf|unsloth, METHOD lora|qlora),
`bare[:train][:autocast][:prefetch2][:qlora]` (HF + PEFT + AdamW in a loop over a DataLoader with 4 workers, pinned
memory and the toolbox's collation; bare_row says what the options change), `trl[:qlora]` (TRL's SFTTrainer on the processor, its own vision collator), `unsloth-recipe`
(FastVisionModel + UnslothVisionDataCollator + TRL's SFTTrainer, as Unsloth's vision notebooks set it up).
Every row: LoRA r16 (alpha 32, no dropout) on the language model's linear layers, batch 4, bf16, no
gradient checkpointing, constant learning rate, lengths padded to 64 (PAD), 4 steps then 16 timed; its own process with an empty CUDA
kernel cache (CUDA_CACHE_PATH), so each pays its first-run kernel builds as a user's first run does.
SHAPE `tiny*` runs the same code on CPU in seconds (how the script is checked before a device call); `gemma3-cpu`
(Gemma 3's layers at CPU size) and `gemma3-cpu-deep` (its layer counts, narrow: host time) are for PROFILE=1 on
a CPU. VR_PRECISION (bf16|fp32) overrides the device's.
Rows go to OUT/vision-rows.json and one line each on stdout; models, data and run folders to VR_WORK (default OUT).
MEMTRACE=1 adds each Trainer row's peak of steps 1-2 by allocation site (`peak_sites`); ROW_TIMEOUT bounds a row.
PROFILE=1 runs torch.profiler over steps 3-4 of every row (after MEMTRACE's, before the timed ones: timings untouched)
and adds `profile` (step_profile.py: wall and GPU-busy seconds, top kernels and ops, cast and sync counts) to the row; the
full tables go to OUT/profile-SHAPE-PATH.txt (every op's count and times in .json; PROFILE_STACKS=1 adds each host
sync's call site, at a Python tracer's cost in the profiled steps). Every row says its attention implementations (`attn`).
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
BATCH, ROWS, R, LR = 4, 96, 16, 1e-4
WARMUP, TIMED = 4, int(os.environ.get("VR_TIMED", 16))  # VR_TIMED: a longer window than a loader prefetches
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


# The references pad to 64 tokens as finetune does (TRL's SFTConfig and Unsloth's collator take it; neither
# does by default): unpadded, a first run builds a new cuDNN attention graph per batch length (~1-3 s each),
# which would put the references behind for a reason a user can set away.
PAD = 64
LANG_LINEAR = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def lora_targets(model) -> list[str]:
    """The reference rows' LoRA targets, found here by module type: the language model's Linear layers."""
    import torch

    return [n for n, m in model.named_modules() if isinstance(m, torch.nn.Linear) and "language_model" in n
            and n.rsplit(".", 1)[-1] in LANG_LINEAR]


def attn_impl(model) -> dict:
    """The attention implementation the model runs, of its config and of its text and vision configs."""
    cfg = model.config
    subs = {"model": cfg, "text": getattr(cfg, "text_config", None), "vision": getattr(cfg, "vision_config", None)}
    return {k: getattr(c, "_attn_implementation", None) for k, c in subs.items() if c is not None}


class Clock:
    """Tokens and time of the timed steps of a Trainer row: the tokens each training_step saw (non-padding,
    summed on the device), the time from the end of step WARMUP to the end of the last (one sync at each)."""

    def __init__(self):
        self.toks, self.t0, self.t1, self.mem_at_start, self.param_bytes, self.attn = [], None, None, None, {}, None
        self.after_step1, self.traced_from, self.memtrace = None, 0, None

    def wrap(self, trainer):
        step = trainer.training_step

        def training_step(model, inputs, *a, **kw):
            if trainer.state.global_step >= WARMUP:
                self.toks.append(inputs["attention_mask"].sum())
            return step(model, inputs, *a, **kw)

        trainer.training_step = training_step
        return trainer

    def callback(self):
        import torch
        from transformers import TrainerCallback

        clock = self

        class C(TrainerCallback):
            def on_train_begin(self, args, state, control, model=None, **kw):
                clock.start(model)
                if MEMTRACE and torch.cuda.is_available():  # warm-up steps only: the timed ones run untraced
                    clock.traced_from = torch.cuda.memory_allocated()
                    torch.cuda.memory._record_memory_history(max_entries=MAX_ENTRIES, stacks="python")

            def on_step_end(self, args, state, control, **kw):
                if state.global_step in (1, WARMUP, WARMUP + TIMED) and torch.cuda.is_available():
                    torch.cuda.synchronize()
                if state.global_step == 1 and torch.cuda.is_available():  # what stays (optimizer states) and the peak
                    clock.after_step1 = [round(torch.cuda.memory_allocated() / 2**30, 3), _peak()]
                if state.global_step == 2 and MEMTRACE and torch.cuda.is_available():
                    snap = torch.cuda.memory._snapshot()
                    torch.cuda.memory._record_memory_history(enabled=None)
                    clock.memtrace = peak_sites(snap["device_traces"][0], clock.traced_from)
                if PROF and state.global_step in (WARMUP - 2, WARMUP):  # after MEMTRACE's steps, before the clock's
                    (PROF.start if state.global_step == WARMUP - 2 else PROF.stop)()
                if state.global_step == WARMUP:
                    clock.t0 = time.perf_counter()
                if state.global_step == WARMUP + TIMED:
                    clock.t1 = time.perf_counter()

        return C()

    def start(self, model):
        import torch

        self.attn = attn_impl(model)
        if torch.cuda.is_available():
            self.mem_at_start = round(torch.cuda.memory_allocated() / 2**30, 3)
        for prm in model.parameters():
            k = f"{prm.dtype}".replace("torch.", "") + ("-trainable" if prm.requires_grad else "")
            self.param_bytes[k] = self.param_bytes.get(k, 0) + prm.numel() * prm.element_size()

    def row(self, tokens: int | None = None) -> dict:
        tokens = int(sum(int(t) for t in self.toks)) if tokens is None else tokens
        return {"tokens_per_s": tokens / (self.t1 - self.t0), "timed_tokens": tokens, "mem_at_start_gib":
                self.mem_at_start, "attn": self.attn, "after_step1_alloc_peak_gib": self.after_step1, "param_gib": {k: round(v / 2**30, 3) for k, v in self.param_bytes.items()},
                **({"memtrace": self.memtrace} if self.memtrace else {})}


# MEMTRACE=1: the allocations of steps 1-2 recorded (torch.cuda.memory._record_memory_history) and the memory
# live at their highest point summed by the first frame outside torch: what a peak is made of.
MEMTRACE = os.environ.get("MEMTRACE") == "1"
PROF = None  # PROFILE=1: one() sets a step_profile.StepProfiler
MAX_ENTRIES = 1_000_000
OWN = ("/torch/", "/contextlib.py", "/functools.py")


def _site(frames: list[dict]) -> str:
    for f in frames:
        name = f.get("filename", "")
        if name.endswith(".py") and not any(o in name for o in OWN):
            short = name.split("site-packages/")[-1].split("entrypoints/")[-1]
            return f"{short}:{f.get('line')} {f.get('name')}"
    return "torch"


def peak_sites(trace: list[dict], before: int, top: int = 30) -> dict:
    """The highest point of the traced allocations (on top of `before` bytes allocated when tracing began) and
    what was live there, summed by allocation site."""
    cur, best, at = 0, 0, -1
    freed = ("free_requested", "free_completed")
    live: dict = {}
    for i, e in enumerate(trace):  # pass 1: where the peak is
        if e["action"] == "alloc":
            live[e["addr"]] = e["size"]
            cur += e["size"]
            if cur > best:
                best, at = cur, i
        elif e["action"] in freed and e["addr"] in live:
            cur -= live.pop(e["addr"])
    live = {}
    for e in trace[:at + 1]:  # pass 2: what is live there
        if e["action"] == "alloc":
            live[e["addr"]] = e
        elif e["action"] in freed:
            live.pop(e["addr"], None)
    sites: dict = {}
    for e in live.values():
        k = _site(e.get("frames", []))
        n, c = sites.get(k, (0, 0))
        sites[k] = (n + e["size"], c + 1)
    ranked = sorted(sites.items(), key=lambda kv: -kv[1][0])[:top]
    return {"before_gib": round(before / 2**30, 3), "traced_peak_gib": round((before + best) / 2**30, 3),
            "events": len(trace), "truncated": len(trace) >= MAX_ENTRIES,
            "sites": [[k, round(n / 2**30, 4), c] for k, (n, c) in ranked]}


def _peak() -> float | None:
    import torch

    return round(torch.cuda.max_memory_allocated() / 2**30, 3) if torch.cuda.is_available() else None


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


def _rows(data: Path) -> list[dict]:
    from toolbox_train.data.dataset import load_raw

    ds, _, _ = load_raw(str(data), "train", data.parent, "data.path", "auto", "text")
    return [{"messages": r["messages"], "images": [str(data.parent / p) for p in r["images"]]} for r in ds]


def nf4() -> dict:
    """The references' `qlora` option: QLoRA's 4-bit NF4 load as finetune's (training/loading.py), written out as a
    user would."""
    import torch
    from transformers import BitsAndBytesConfig

    return {"quantization_config": BitsAndBytesConfig(
        load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
        bnb_4bit_compute_dtype=torch.bfloat16, bnb_4bit_quant_storage=torch.bfloat16)}


def bare_row(model_dir: Path, data: Path, precision: str, seq: int, opts: tuple[str, ...] = ()) -> dict:
    """HF + PEFT + AdamW (fused) in a loop; a DataLoader with 4 workers, pinned memory and prefetching runs the
    toolbox's collation (labels on the answers, lengths padded to 64) beside the GPU. `opts` (`bare:train:autocast`):
    `train` puts the model in train mode (from_pretrained leaves it in eval mode, the Trainer calls train()),
    `autocast` runs the forward under torch.autocast in bf16 as the Trainer does, `prefetch2` prefetches 2 batches a
    worker (the Trainer's default) instead of 4, `qlora` loads the model in 4 bits (nf4)."""
    import torch
    from peft import LoraConfig, get_peft_model
    from torch.utils.data import DataLoader
    from transformers import AutoModelForImageTextToText

    from toolbox_train.models.vision import load_processor
    from toolbox_train.training.vision import PAD_MULTIPLE, VisionCollator

    dev = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    torch.manual_seed(0)
    if "qlora" in opts:
        model = AutoModelForImageTextToText.from_pretrained(model_dir, dtype=dtype, device_map={"": dev}, **nf4())
    else:
        model = AutoModelForImageTextToText.from_pretrained(model_dir, dtype=dtype).to(dev)
    model = get_peft_model(model, LoraConfig(r=R, lora_alpha=2 * R, lora_dropout=0.0, target_modules=lora_targets(model)))
    if "train" in opts:
        model.train()
    autocast = torch.autocast(dev, dtype=torch.bfloat16, enabled="autocast" in opts and dtype == torch.bfloat16)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=LR, fused=dev == "cuda")
    workers = 4 if dev == "cuda" else 0
    loader = DataLoader(_rows(data), batch_size=BATCH, shuffle=True, num_workers=workers, pin_memory=dev == "cuda",
                        collate_fn=VisionCollator(load_processor(str(model_dir)), seq,
                                                  pad_multiple=PAD_MULTIPLE if dev == "cuda" else 1),
                        persistent_workers=workers > 0,
                        prefetch_factor=(2 if "prefetch2" in opts else 4) if workers else None,
                        generator=torch.Generator().manual_seed(0))
    toks, t0, losses = [], None, []
    def epochs():  # as the Trainer does: a window longer than an epoch (24 batches) goes on into the next
        while True:
            yield from loader

    batches = epochs()
    for k in range(WARMUP + TIMED):
        if PROF and k == WARMUP - 2:  # the same two steps as a Trainer row's, their batches' waits included
            PROF.start()
        if k == WARMUP:
            torch.cuda.synchronize() if dev == "cuda" else None
            t0 = time.perf_counter()
        b = {n: v.to(dev, non_blocking=True) for n, v in next(batches).items()}
        if k >= WARMUP:
            toks.append(b["attention_mask"].sum())
        with autocast:
            loss = model(**b).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.detach())
        if PROF and k == WARMUP - 1:
            PROF.stop()
    torch.cuda.synchronize() if dev == "cuda" else None
    secs = time.perf_counter() - t0
    tokens = int(sum(int(t) for t in toks))
    return {"tokens_per_s": tokens / secs, "timed_tokens": tokens, "peak_gib": _peak(), "attn": attn_impl(model),
            "losses": [round(float(x), 4) for x in losses]}


def _trl_args(out: Path, precision: str, seq: int, **kw):
    from trl import SFTConfig

    return SFTConfig(output_dir=str(out), per_device_train_batch_size=BATCH, max_steps=WARMUP + TIMED,
                     learning_rate=LR, lr_scheduler_type="constant", warmup_steps=0, bf16=precision == "bf16",
                     use_cpu=precision != "bf16", gradient_checkpointing=False, logging_steps=1, save_strategy="no",
                     report_to=[], seed=0, max_length=seq, **kw)


def trl_row(model_dir: Path, data: Path, out: Path, precision: str, seq: int, opts: tuple[str, ...] = ()) -> dict:
    """TRL's SFTTrainer on the processor, as TRL's docs set up vision SFT: `messages` + `images` (PIL) rows, the
    trainer's own vision collator, a PEFT LoraConfig; train on the whole sequence (TRL's default here)."""
    import torch
    from datasets import Dataset
    from peft import LoraConfig
    from PIL import Image
    from transformers import AutoModelForImageTextToText
    from trl import SFTTrainer

    from toolbox_train.models.vision import load_processor

    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    model = AutoModelForImageTextToText.from_pretrained(model_dir, dtype=dtype, **(nf4() if "qlora" in opts else {}))
    rows = [{"messages": r["messages"], "images": [Image.open(p).convert("RGB") for p in r["images"]]}
            for r in _rows(data)]
    clock = Clock()
    trainer = SFTTrainer(model=model, args=_trl_args(out, precision, seq, pad_to_multiple_of=PAD, dataloader_num_workers=4
                                                     if precision == "bf16" else 0),
                         train_dataset=Dataset.from_list(rows), processing_class=load_processor(str(model_dir)),
                         peft_config=LoraConfig(r=R, lora_alpha=2 * R, lora_dropout=0.0,
                                                target_modules=lora_targets(model)),
                         callbacks=[clock.callback()])
    clock.wrap(trainer).train()
    return {**clock.row(), "peak_gib": _peak(),
            "losses": [round(h["loss"], 4) for h in trainer.state.log_history if "loss" in h]}


def unsloth_row(model_dir: Path, data: Path, out: Path, precision: str, seq: int, method: str = "lora") -> dict:
    """Unsloth's vision notebooks: FastVisionModel (16-bit for LoRA, 4-bit for QLoRA), get_peft_model on the
    language layers, for_training, UnslothVisionDataCollator, SFTTrainer with remove_unused_columns=False,
    dataset_text_field "", skip_prepare_dataset and adamw_8bit (the notebooks' optimizer)."""
    from unsloth import FastVisionModel
    from unsloth.trainer import UnslothVisionDataCollator
    from PIL import Image
    from trl import SFTTrainer

    import torch

    model, proc = FastVisionModel.from_pretrained(str(model_dir), load_in_4bit=method == "qlora",
                                                 load_in_16bit=method == "lora", max_seq_length=seq,
                                                 use_gradient_checkpointing=False)
    model = FastVisionModel.get_peft_model(model, finetune_vision_layers=False, finetune_language_layers=True,
                                           finetune_attention_modules=True, finetune_mlp_modules=True, r=R,
                                           lora_alpha=2 * R, lora_dropout=0, bias="none", random_state=0,
                                           use_gradient_checkpointing=False)
    FastVisionModel.for_training(model)

    def convert(r):  # the notebooks' form: the image inside the user turn
        imgs = iter([Image.open(p).convert("RGB") for p in r["images"]])
        return {"messages": [{"role": m["role"], "content": [
            {"type": "image", "image": next(imgs)} if c["type"] == "image" else c for c in m["content"]]}
            for m in r["messages"]]}

    clock = Clock()
    trainer = SFTTrainer(model=model, processing_class=proc, data_collator=UnslothVisionDataCollator(model, proc, pad_to_multiple_of=PAD),
                         train_dataset=[convert(r) for r in _rows(data)],
                         args=_trl_args(out, precision, seq, optim="adamw_8bit", remove_unused_columns=False,
                                        dataset_text_field="", dataset_kwargs={"skip_prepare_dataset": True},
                                        dataloader_num_workers=0),
                         callbacks=[clock.callback()])
    clock.wrap(trainer).train()
    del torch
    return {**clock.row(), "peak_gib": _peak(),
            "losses": [round(h["loss"], 4) for h in trainer.state.log_history if "loss" in h]}


def _slug(path: str) -> str:
    return path.replace(':', '-').replace(',', '-').replace('=', '')


def one(out: Path, shape: str, path: str) -> dict:
    import torch

    global PROF
    if os.environ.get("PROFILE") == "1":  # its table beside the row's log, in what a device call returns
        from step_profile import StepProfiler  # beside this file, on sys.path from the top

        PROF = StepProfiler(out / f"profile-{shape}-{_slug(path)}.txt")
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
            **({"profile": PROF.summary} if PROF else {})}


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
