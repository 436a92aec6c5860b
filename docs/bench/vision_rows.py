"""Issue 40's GPU rows: vision-language LoRA SFT, `finetune` against a bare loop of the same backend (HF: the
model, PEFT and AdamW, no Trainer), on random-init models of Gemma-3-4B's and Qwen2.5-VL-7B's shapes (the
whole vision tower, fewer text layers) with images at the family's default resolution; tokens/s over the timed
steps, peak memory, and the memory planner's prediction beside the measured peak.

    python docs/bench/vision_rows.py OUT [--shapes gemma3-4b-4l,qwen2.5-vl-7b-4l] [--paths finetune,bare]
    python docs/bench/vision_rows.py OUT --one SHAPE PATH     (one row; what the driver runs per process)

SHAPE `tiny` runs the same code on CPU in seconds (how the script was checked before a device call).
Rows go to OUT/vision-rows.json and one line each on stdout.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "entrypoints")]
BATCH, ROWS, R, LR = 4, 96, 16, 1e-4
WARMUP, TIMED = 3, 10
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
SHAPES = {  # name -> (family, text layers, image side in pixels, data.max_seq_length)
    "gemma3-4b-4l": ("gemma3", 4, 896, 1024), "qwen2.5-vl-7b-4l": ("qwen2.5-vl", 4, 448, 1024),
    "tiny": ("gemma3", 2, 28, 128),
}


def make_model(shape: str, folder: Path) -> Path:
    """The shape's random-init model (bf16) with its processor, saved once into `folder`."""
    if (folder / "config.json").is_file():
        return folder
    import torch

    from tests.helpers import tiny_vision

    family, layers, side, _ = SHAPES[shape]
    if shape == "tiny":
        return tiny_vision.make_tiny_vlm(folder, "gemma3")
    tiny_vision.make_tiny_vlm(folder, family)  # tokenizer, processor and chat template at the tiny size
    import transformers as tf

    cfg = tf.AutoConfig.from_pretrained(folder)
    if family == "gemma3":
        text = {k: v for k, v in cfg.text_config.to_dict().items() if k != "layer_types"}  # remade for `layers`
        text = {**text, **GEMMA_TEXT, "num_hidden_layers": layers}
        cfg = tf.Gemma3Config(text_config=text, vision_config={**cfg.vision_config.to_dict(), **SIGLIP},
                              mm_tokens_per_image=256, boi_token_index=cfg.boi_token_index,
                              eoi_token_index=cfg.eoi_token_index, image_token_index=cfg.image_token_index)
        proc = tf.AutoProcessor.from_pretrained(folder)
        proc.image_processor.size = {"height": side, "width": side}
        proc.image_seq_length = 256  # saved, and the image's token run rebuilt from it when loaded
    else:
        text = {k: v for k, v in cfg.text_config.to_dict().items() if k != "layer_types"}
        text = {**text, **QWEN_TEXT, "num_hidden_layers": layers}
        cfg = type(cfg)(text_config=text, vision_config={**cfg.vision_config.to_dict(), **QWEN_VISION},
                        image_token_id=cfg.image_token_id, video_token_id=cfg.video_token_id,
                        vision_start_token_id=cfg.vision_start_token_id, vision_end_token_id=cfg.vision_end_token_id)
        proc = tf.AutoProcessor.from_pretrained(folder, min_pixels=side * side, max_pixels=side * side)
    with torch.device("cuda" if torch.cuda.is_available() else "cpu"):
        model = tf.AutoModelForImageTextToText.from_config(cfg, dtype=torch.bfloat16)
    model.save_pretrained(folder, safe_serialization=True)
    proc.save_pretrained(folder)
    return folder


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


def finetune_row(model: Path, data: Path, out: Path, precision: str, seq: int) -> dict:
    from toolbox_train.commands import finetune

    cfg = {"model": {"path": str(model)}, "data": {"path": str(data), "max_seq_length": seq}, "method": "lora",
           "backend": "hf", "lora": {"r": R, "alpha": 2 * R, "dropout": 0.0}, "vision": {"train": ["language"]},
           "train": {"max_steps": WARMUP + TIMED, "per_device_batch_size": BATCH, "learning_rate": LR,
                     "lr_scheduler": "constant", "warmup_steps": 0, "precision": precision,
                     "gradient_checkpointing": False, "seed": 0},
           "output": {"dir": str(out), "save_steps": 0, "progress_bar": False, "save": "adapter"}}
    finetune.run(cfg)
    steps = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    toks = [b["tokens"] - a["tokens"] for a, b in zip(steps, steps[1:])][WARMUP - 1:]
    secs = [t / s["tokens_per_s"] for t, s in zip(toks, steps[WARMUP:])]
    plan = __import__("yaml").safe_load((out / "config.resolved.yaml").read_text())["_resolved"]
    return {"tokens_per_s": sum(toks) / sum(secs), "peak_gib": max(s["peak_mem_gib"] for s in steps),
            "planned_gib": plan.get("predicted_peak_gib")}


def bare_row(model_dir: Path, data: Path, precision: str, seq: int) -> dict:
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForImageTextToText

    from toolbox_train.data.dataset import load_raw
    from toolbox_train.models.vision import load_processor, lora_target_regex
    from toolbox_train.training.vision import VisionCollator

    dev = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    torch.manual_seed(0)
    model = AutoModelForImageTextToText.from_pretrained(model_dir, dtype=dtype).to(dev)
    model = get_peft_model(model, LoraConfig(r=R, lora_alpha=2 * R, lora_dropout=0.0,
                                             target_modules=lora_target_regex(["language"], "all-linear")))
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=LR)
    ds, _, _ = load_raw(str(data), "train", data.parent, "data.path", "auto", "text")
    rows = [{"messages": r["messages"], "images": r["images"]} for r in ds]
    collate = VisionCollator(load_processor(str(model_dir)), seq)
    if dev == "cuda":
        torch.cuda.reset_peak_memory_stats()
    toks, t0 = 0, None
    for k in range(WARMUP + TIMED):
        if k == WARMUP:
            torch.cuda.synchronize() if dev == "cuda" else None
            t0 = time.perf_counter()
        # collated in the loop, as finetune's data loader does (the processor resizes each image)
        b = {n: v.to(dev) for n, v in collate(rows[k * BATCH:(k + 1) * BATCH]).items()}
        if k >= WARMUP:
            toks += int(b["attention_mask"].sum())
        model(**b).loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    torch.cuda.synchronize() if dev == "cuda" else None
    peak = torch.cuda.max_memory_allocated() / 2**30 if dev == "cuda" else None
    return {"tokens_per_s": toks / (time.perf_counter() - t0), "peak_gib": peak}


def one(out: Path, shape: str, path: str) -> dict:
    import torch

    precision = "bf16" if torch.cuda.is_available() else "fp32"
    model = make_model(shape, out / f"model-{shape}")
    data = make_data(out / f"data-{shape}" / "train.jsonl", SHAPES[shape][2])
    t0 = time.time()
    seq = SHAPES[shape][3]
    row = finetune_row(model, data, out / f"run-{shape}", precision, seq) if path == "finetune" else \
        bare_row(model, data, precision, seq)
    return {"shape": shape, "path": path, "precision": precision, "batch": BATCH, "timed_steps": TIMED,
            "wall_s": round(time.time() - t0, 1), **row}


def main(argv: list[str]) -> int:
    out = Path(argv[0])
    out.mkdir(parents=True, exist_ok=True)
    if "--one" in argv:
        i = argv.index("--one")
        print(json.dumps(one(out, argv[i + 1], argv[i + 2])))
        return 0
    opt = dict(zip(argv[1::2], argv[2::2]))
    rows = []
    for shape in opt.get("--shapes", "gemma3-4b-4l,qwen2.5-vl-7b-4l").split(","):
        for path in opt.get("--paths", "finetune,bare").split(","):
            log = out / f"{shape}-{path}.log"
            with open(log, "w") as f:
                r = subprocess.run([sys.executable, __file__, str(out), "--one", shape, path], stdout=subprocess.PIPE,
                                   stderr=f, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
            row = json.loads(r.stdout.strip().splitlines()[-1]) if r.returncode == 0 and r.stdout.strip() else \
                {"shape": shape, "path": path, "error": f"exit {r.returncode}, see {log.name}"}
            rows.append(row)
            print(json.dumps(row), flush=True)
            (out / "vision-rows.json").write_text(json.dumps(rows, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
