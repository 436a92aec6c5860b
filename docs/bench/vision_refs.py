"""The reference rows of vision_rows.py (issues 40, 44): what a user would run in finetune's place, set up as the
libraries' docs set them up, on the same model, data, LoRA, batch and timed window (vision_clock.py):

- `bare_row`: HF + PEFT + AdamW in a loop over a DataLoader running the toolbox's collation;
- `trl_row`: TRL's SFTTrainer on the processor with its own vision collator;
- `unsloth_row`: Unsloth's vision notebooks (FastVisionModel, UnslothVisionDataCollator, SFTTrainer);
- `nf4`: the references' `qlora` option, a 4-bit NF4 load as finetune's.
"""

from __future__ import annotations

import time
from pathlib import Path

import vision_clock  # PROF read through the module: vision_rows.one() sets it there
from vision_clock import BATCH, LR, R, TIMED, WARMUP, Clock, _peak, attn_impl

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
        if vision_clock.PROF and k == WARMUP - 2:  # the same two steps as a Trainer row's, their batches' waits included
            vision_clock.PROF.start()
        if k == WARMUP:
            if vision_clock.SPY:  # started before the clock reads: its start-up is not in the timed window
                vision_clock.SPY.start()
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
        if vision_clock.PROF and k == WARMUP - 1:
            vision_clock.PROF.stop()
    torch.cuda.synchronize() if dev == "cuda" else None
    secs = time.perf_counter() - t0
    if vision_clock.SPY:
        vision_clock.SPY.stop()
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

    if not torch.cuda.is_available():  # a CPU dry run: TRL 1.15's fused head is Triton's; finetune's stand-in
        from toolbox_train.training import logprob

        logprob.install()
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
