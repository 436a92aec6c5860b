"""The processor of a vision-language model, and which parts of it train on image rows (vision.train: language, vision, projector),
told by module path: SigLIP's and Qwen's vision blocks reuse the language model's q_proj/gate_proj/...
names, so LoRA targets are chosen by path, never by name alone."""

from __future__ import annotations

import re

from toolbox_train.contract import UserError, first_line
from toolbox_train.models.arithmetic import LORA_ALL_LINEAR

PARTS = ("language", "vision", "projector")
DEFAULT_TRAIN = ("language",)  # the peers' default (LLaMA-Factory, TRL's VLM recipes): the vision tower frozen
# Module paths of each part, by family: Gemma 3 / Llava (vision_tower, multi_modal_projector), Qwen2/2.5/3-VL
# (visual.blocks..., its patch merger the projector), Idefics/SmolVLM (vision_model, connector).
PROJECTOR_PATHS = r"multi_modal_projector|visual\.merger|connector|mm_projector"
VISION_PATHS = r"vision_tower|visual|vision_model"
PROJECTOR = re.compile(rf"(^|\.)({PROJECTOR_PATHS})(\.|$)")
VISION = re.compile(rf"(^|\.)({VISION_PATHS})(\.|$)")
# all-linear in the vision tower: SigLIP's attention and MLP (q/k/v/out_proj, fc1, fc2), Qwen-VL's (qkv, proj,
# gate/up/down_proj).
VISION_LINEAR = ("q_proj", "k_proj", "v_proj", "out_proj", "fc1", "fc2", "qkv", "proj", "gate_proj", "up_proj",
                 "down_proj")


def part_of(name: str) -> str:
    """The part a parameter or module path belongs to."""
    if PROJECTOR.search(name):
        return "projector"
    if VISION.search(name):
        return "vision"
    return "language"


def set_trainable(model, train) -> dict[str, int]:
    """Full fine-tuning: freeze the parts not in `train`; returns trainable parameters per part."""
    counts = dict.fromkeys(PARTS, 0)
    for name, prm in model.named_parameters():
        part = part_of(name)
        prm.requires_grad_(part in train)
        if part in train:
            counts[part] += prm.numel()
    return counts


def _names(names) -> str:
    return "|".join(re.escape(x) for x in names)


def lora_target_regex(train, target_modules) -> str:
    """PEFT target_modules, a regex over module paths: the named (or all-linear) Linear modules of the language
    model and, where `train` has it, the vision tower; no other part's modules, whatever their names."""
    every = target_modules == "all-linear"
    keep = []
    if "language" in train:
        lang = _names(LORA_ALL_LINEAR if every else target_modules)
        keep.append(rf"(?!(.*\.)?({VISION_PATHS}|{PROJECTOR_PATHS})\.).*\.({lang})")
    if "vision" in train:
        vis = _names(VISION_LINEAR if every else target_modules)
        keep.append(rf"(?!(.*\.)?({PROJECTOR_PATHS})\.)(.*\.)?({VISION_PATHS})\..*\.({vis})")
    return rf"^({'|'.join(keep)})$"


def projector_modules(model) -> list[str]:
    """The projector's root modules (LoRA: trained whole through PEFT's modules_to_save: Gemma 3's is a bare
    weight matrix, no Linear to adapt)."""
    roots = []
    for name, _ in model.named_modules():
        if PROJECTOR.search(name) and not any(name.startswith(r + ".") for r in roots):
            roots.append(name)
    return [r.rsplit(".", 1)[-1] if "merger" not in r else "merger" for r in roots]


def load_processor(path: str, revision: str | None = None, trust_remote_code: bool = False):
    """The model folder's processor (a ProcessorMixin with an image processor), or UserError."""
    from transformers import AutoProcessor, ProcessorMixin

    try:
        proc = AutoProcessor.from_pretrained(path, revision=revision, trust_remote_code=trust_remote_code)
    except Exception as exc:  # a missing preprocessor/processor config; Qwen-VL's video processor without torchvision
        raise UserError(f"model.path: {path}: cannot load the model's processor for image rows: "
                        f"{first_line(exc)[:300]}") from None
    if not isinstance(proc, ProcessorMixin) or getattr(proc, "image_processor", None) is None:
        raise UserError(f"model.path: {path}: has no image processor (processor_config.json / "
                        "preprocessor_config.json); image rows need one")
    return proc


def marker_count(proc, text: str) -> int:
    """Image markers in a rendered conversation, as the processor counts them (Gemma 3: <start_of_image>;
    Qwen-VL: <|image_pad|>)."""
    mark = getattr(proc, "image_token", None)
    return text.count(mark) if isinstance(mark, str) and mark else -1


def row_problems(proc, rows, locate) -> list[tuple[str, str]]:
    """(where, why) of each image row the processor's chat template cannot take: it fails, or it renders
    another number of image markers than the row has images (Qwen's processor accepts two images for one
    marker; the model fails later), or its turns are not prefixes of the whole (the labels need them)."""
    bad = []
    for i, row in enumerate(rows):
        msgs, n = row["messages"], len(row["images"] or [])
        try:
            text = proc.apply_chat_template(msgs, tokenize=False)
            marks = marker_count(proc, text)
            if marks not in (-1, n):
                bad.append((locate(i), f"the chat template renders {marks} image marker(s) for the row's {n} "
                            "image(s) (it must render one per {\"type\": \"image\"} part)"))
                continue
            for k, m in enumerate(msgs):
                if m["role"] == "assistant":
                    prompt = proc.apply_chat_template(msgs[:k], tokenize=False, add_generation_prompt=True)
                    through = proc.apply_chat_template(msgs[:k + 1], tokenize=False)
                    if not (text.startswith(through) and through.startswith(prompt)):
                        bad.append((locate(i), f"messages[{k}]: the chat template does not render the turns as "
                                    "prefixes of the conversation (the assistant turns cannot be located)"))
                        break
        except Exception as exc:  # jinja2's TemplateError (raise_exception), or no template at all
            bad.append((locate(i), f"the processor's chat template rejects this conversation: {first_line(exc)[:200]}"))
    return bad
