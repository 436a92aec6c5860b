"""Model loading: the Hugging Face path (transformers + a PEFT LoraConfig) and the Unsloth path.

Both return (model, tokenizer, peft_config or None); the Trainer applies a PEFT config itself.
"""

from __future__ import annotations

from typing import Any

from toolbox_train.models.families import LORA_ALL_LINEAR, family
from toolbox_train.units.objective import HEADS
from toolbox_train.planning.run import Dist, ResolvedRun, using_fsdp
from toolbox_train.models.lora import head, peft_config
from toolbox_train.models.vision import part_of
from toolbox_train.data.images import FORMAT as VISION_FORMAT


def torch_dtype(p: ResolvedRun):
    import torch

    return {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[p.precision]


def quantization(p: ResolvedRun) -> dict[str, Any]:
    """from_pretrained's quantization_config for qlora / lora-8bit (bitsandbytes), else nothing."""
    if p.cfg.method not in ("qlora", "lora-8bit"):
        return {}
    import torch
    from transformers import BitsAndBytesConfig

    return {"quantization_config": (
        BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
                           bnb_4bit_compute_dtype=torch.bfloat16, bnb_4bit_quant_storage=torch.bfloat16)
        if p.cfg.method == "qlora" else BitsAndBytesConfig(load_in_8bit=True))}


def load_hf(p: ResolvedRun, dist: Dist):
    import transformers
    from transformers import AutoTokenizer

    kw: dict[str, Any] = dict(revision=p.cfg.model.revision, trust_remote_code=p.cfg.model.trust_remote_code,
                              dtype=torch_dtype(p))
    if p.cfg.model.attn_implementation:
        kw["attn_implementation"] = p.cfg.model.attn_implementation
    if p.gpu and not using_fsdp():
        kw["device_map"] = {"": dist.local_rank}  # each DDP rank on its own device
    kw.update(quantization(p))
    tok = AutoTokenizer.from_pretrained(p.model_path, revision=p.cfg.model.revision,
                                        trust_remote_code=p.cfg.model.trust_remote_code)
    auto, _, head_kw = HEADS[head(p)]  # the objective's model class (objectives/<name>/)
    model = getattr(transformers, auto).from_pretrained(p.model_path, **kw, **head_kw)
    if p.multimodal:
        # Text data never reaches the vision tower: freeze it so DDP needs no unused-parameter search.
        for name, prm in model.named_parameters():
            if part_of(name) != "language":
                prm.requires_grad_(False)
    return model, tok, (peft_config(p) if p.cfg.method != "full" else None)


def load_unsloth(p: ResolvedRun, dist: Dist):
    from unsloth import FastLanguageModel, FastModel

    # FastModel handles Gemma 3 (and its multimodal wrapper); FastLanguageModel the text-only families.
    loader = FastModel if (p.multimodal or family(p.model_config.model_type).unsloth_fast_model) else FastLanguageModel
    gc = p.gradient_checkpointing  # resolved by the memory plan (train.gradient_checkpointing: auto)
    use_gc = "unsloth" if gc in (True, "unsloth") else False
    model, tok = loader.from_pretrained(
        model_name=p.model_path,
        max_seq_length=p.seq_tokens,  # GRPO: prompt + completion (Unsloth cuts longer inputs)
        dtype=None if p.precision == "fp32" else torch_dtype(p),
        load_in_4bit=p.cfg.method == "qlora",
        load_in_8bit=p.cfg.method == "lora-8bit",
        load_in_16bit=p.cfg.method == "lora",  # Unsloth's loader defaults to 4-bit otherwise
        full_finetuning=p.cfg.method == "full",
        device_map={"": dist.local_rank} if dist.world_size > 1 else "sequential",
        use_gradient_checkpointing=use_gc,
        trust_remote_code=p.cfg.model.trust_remote_code,
        revision=p.cfg.model.revision,
    )
    tok = getattr(tok, "tokenizer", tok)  # FastModel returns a processor for multimodal models
    if p.cfg.method != "full":
        c = p.cfg.lora
        kw: dict[str, Any] = dict(r=c.r, lora_alpha=c.alpha, lora_dropout=c.dropout, bias="none",
                                  use_gradient_checkpointing=use_gc, random_state=p.cfg.train.seed)
        if c.target_modules != "all-linear":
            kw["target_modules"] = c.target_modules
        elif loader is FastLanguageModel:
            kw["target_modules"] = list(LORA_ALL_LINEAR)
        if loader is FastModel:
            kw.update(finetune_vision_layers=False, finetune_language_layers=True,
                      finetune_attention_modules=True, finetune_mlp_modules=True)
        model = loader.get_peft_model(model, **kw)
    return model, tok, None


def load_vision(p: ResolvedRun, dist: Dist):
    """Image rows: the image-text-to-text model, its processor (in the tokenizer's place), the parts that
    train (vision.train) frozen or adapted by module path (models/vision.py)."""
    import transformers

    from toolbox_train.models import vision

    c, train = p.cfg, p.cfg.vision.train
    proc = vision.load_processor(p.model_path, c.model.revision, c.model.trust_remote_code, **vision.budget(c))
    if p.backend == "unsloth":  # FastVisionModel: checked against a stand-in only (Unsloth needs a GPU)
        from unsloth import FastVisionModel

        gc = "unsloth" if p.gradient_checkpointing in (True, "unsloth") else False
        model, _ = FastVisionModel.from_pretrained(  # the processor: ours, with the budget the checks saw
            model_name=p.model_path, max_seq_length=p.seq_tokens,
            dtype=None if p.precision == "fp32" else torch_dtype(p), load_in_4bit=c.method == "qlora",
            load_in_8bit=c.method == "lora-8bit", load_in_16bit=c.method == "lora", full_finetuning=c.method == "full",
            device_map={"": dist.local_rank} if dist.world_size > 1 else "sequential", use_gradient_checkpointing=gc,
            trust_remote_code=c.model.trust_remote_code, revision=c.model.revision)
        if c.method != "full":  # Unsloth's switches: the projector goes with its vision layers
            model = FastVisionModel.get_peft_model(
                model, finetune_vision_layers="vision" in train, finetune_language_layers="language" in train,
                finetune_attention_modules=True, finetune_mlp_modules=True, r=c.lora.r, lora_alpha=c.lora.alpha,
                lora_dropout=c.lora.dropout, bias="none", use_gradient_checkpointing=gc, random_state=c.train.seed)
        return model, proc, None
    kw: dict[str, Any] = dict(revision=c.model.revision, trust_remote_code=c.model.trust_remote_code,
                              dtype=torch_dtype(p))
    if c.model.attn_implementation:
        kw["attn_implementation"] = c.model.attn_implementation
    if p.gpu and not using_fsdp():
        kw["device_map"] = {"": dist.local_rank}
    kw.update(quantization(p))  # QLoRA: the vision tower quantized too (untested here: bitsandbytes needs a GPU)
    auto, _, head_kw = HEADS[head(p, image_rows=True)]  # SFT's causal LM in its image-text-to-text form
    model = getattr(transformers, auto).from_pretrained(p.model_path, **kw, **head_kw)
    if c.method == "full":
        vision.set_trainable(model, train)
        return model, proc, None
    return model, proc, peft_config(p, model)  # Linear modules by path, read off the loaded model (models/lora.py)


def load(p: ResolvedRun, dist: Dist):
    """(model, tokenizer or processor, PEFT config or None) of the run; image rows (the run's data format,
    read by preflight) load the vision-language model."""
    if p.data_format == VISION_FORMAT:
        return load_vision(p, dist)
    return load_unsloth(p, dist) if p.backend == "unsloth" else load_hf(p, dist)
