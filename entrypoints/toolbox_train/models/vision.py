"""The processor of a vision-language model, and which of its parts train on image rows (vision.train:
language, vision, projector), told by module path: SigLIP's and Qwen's vision blocks reuse the language
model's q_proj/gate_proj/... names, so LoRA targets are chosen by path and module kind, never by name alone."""

from __future__ import annotations

import re

from toolbox_train.contract import UserError, first_line
from toolbox_train.models.families import LORA_ALL_LINEAR, every_family

PARTS = ("language", "vision", "projector")


# Module paths of each part: every family's in the table (models/families.py: Gemma 3 / LLaVA vision_tower and
# multi_modal_projector, Qwen-VL visual.blocks... and its patch merger, Idefics3 / SmolVLM vision_model and
# connector), read when asked, so that an entry added is seen.
def projector_paths() -> str:
    return _names(every_family("projector_paths"))


def vision_paths() -> str:
    return _names(every_family("tower_paths"))


def projector_modules() -> tuple[str, ...]:
    """LoRA with vision.train's projector: the projector trained whole (PEFT's modules_to_save, matched by the end
    of a module's path): Gemma 3's is a bare weight matrix, no Linear to adapt."""
    return every_family("projector_paths")


def part_of(name: str) -> str:
    """The part a parameter or module path belongs to."""
    if re.search(rf"(^|\.)({projector_paths()})(\.|$)", name):
        return "projector"
    if re.search(rf"(^|\.)({vision_paths()})(\.|$)", name):
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
    """The module paths LoRA may adapt, a regex: the named (or all-linear) modules of the language model and,
    where `train` has it, the named (or any) modules of the vision tower; no other part's modules, whatever their
    names. lora_target_names keeps the Linear ones."""
    every = target_modules == "all-linear"
    vis_paths, proj_paths = vision_paths(), projector_paths()
    keep = []
    if "language" in train:
        lang = _names(LORA_ALL_LINEAR if every else target_modules)
        keep.append(rf"(?!(.*\.)?({vis_paths}|{proj_paths})(\.|$)).*\.({lang})")
    if "vision" in train:
        vis = ".*" if every else rf".*\.({_names(target_modules)})"
        keep.append(rf"(?!(.*\.)?({proj_paths})(\.|$))(.*\.)?({vis_paths})\.{vis}")
    return rf"^({'|'.join(keep)})$" if keep else r"(?!)"


def lora_target_names(model, train, target_modules) -> list[str]:
    """PEFT target_modules on a vision-language model: the full paths of the modules LoRA adapts, chosen by path
    (lora_target_regex) and by module kind. In the vision tower only nn.Linear modules: Qwen-VL's patch embedding
    is an nn.Conv3d named `proj`, as its blocks' attention output is, and a name pattern put LoRA on it (issue
    44); SigLIP's is an nn.Conv2d. In the language model the all-linear names' nn.Linear modules (never the LM
    head: `lm_head` lies outside it), or the modules named in lora.target_modules that PEFT adapts as it would on
    text (Linear, Embedding, Conv1D). PEFT's own all-linear cannot be used here: it reduces the Linear modules to
    their last names (`proj`), which match the convolution again."""
    import torch
    from transformers.pytorch_utils import Conv1D

    rx = re.compile(lora_target_regex(train, target_modules))
    named = (torch.nn.Linear,) if target_modules == "all-linear" else (torch.nn.Linear, torch.nn.Embedding, Conv1D)
    kinds = {"vision": (torch.nn.Linear,), "language": named, "projector": ()}  # the projector: never (whole)
    return [n for n, m in model.named_modules() if n and rx.fullmatch(n) and isinstance(m, kinds[part_of(n)])]


def budget(cfg) -> dict[str, int]:
    """vision.min_pixels / max_pixels, as the processor's keyword arguments (only those set)."""
    v = cfg.vision
    return {k: getattr(v, k) for k in ("min_pixels", "max_pixels") if getattr(v, k) is not None}


def budget_problem(proc, cfg) -> str | None:
    """A resolution budget the image processor cannot honour: one without min/max pixels (Gemma 3 resizes every
    image to its tower's size), or a max_pixels below one token's pixels."""
    want = budget(cfg)
    if not want:
        return None
    ip = proc.image_processor
    field = f"vision.{next(iter(want))}"
    size = getattr(ip, "size", None)
    if not (hasattr(ip, "merge_size") and getattr(size, "longest_edge", None)):  # Qwen-VL's: pixels, merged patches
        shown = f"{size.height}x{size.width}" if getattr(size, "height", None) else str(size)
        return (f"{field}: {type(ip).__name__} takes no pixel budget (it resizes every image to {shown}, a fixed "
                "number of tokens); leave vision.min_pixels / max_pixels out for this model")
    per = (getattr(ip, "patch_size", 14) * getattr(ip, "merge_size", 2)) ** 2
    if want.get("max_pixels", per) < per:
        return f"vision.max_pixels: {want['max_pixels']} is below one image token ({per} pixels)"
    return None


def load_processor(path: str, revision: str | None = None, trust_remote_code: bool = False, **budget_kw):
    """The model folder's processor (a ProcessorMixin with an image processor), or UserError. `budget_kw`:
    min_pixels / max_pixels for the image processor (budget())."""
    from transformers import AutoProcessor, ProcessorMixin

    try:
        proc = AutoProcessor.from_pretrained(path, revision=revision, trust_remote_code=trust_remote_code,
                                             **budget_kw)
    except Exception as exc:  # a missing preprocessor/processor config; Qwen-VL's video processor without torchvision
        raise UserError(f"model.path: {path}: cannot load the model's processor for image rows: "
                        f"{first_line(exc)[:300]}") from None
    if not isinstance(proc, ProcessorMixin) or getattr(proc, "image_processor", None) is None:
        raise UserError(f"model.path: {path}: has no image processor (processor_config.json / "
                        "preprocessor_config.json); image rows need one")
    try:  # the ids the model reads its image tokens and markers by (image_token_ids); no config: the names only
        from transformers import AutoConfig

        mc = AutoConfig.from_pretrained(path, revision=revision, trust_remote_code=trust_remote_code)
        setattr(proc, CONFIG_IDS, frozenset(config_image_ids(mc)))
    except Exception:  # a folder with the processor only (a LoRA run's): the model's loader says what is missing
        pass
    return proc


def marker_count(proc, text: str) -> int:
    """Image markers in a rendered conversation, as the processor counts them (Gemma 3: <start_of_image>;
    Qwen-VL: <|image_pad|>)."""
    mark = getattr(proc, "image_token", None)
    return text.count(mark) if isinstance(mark, str) and mark else -1


# The processor / tokenizer attributes naming the tokens an image becomes or is framed by (never a label), and
# the markers' strings where neither names them (taken only where the tokenizer has the string as an added
# token): every family's (families.Family.token_attrs, image_markers).
# The model config's fields naming them: Gemma 3 / Llama 4 image, boi, eoi_token_index; Llava, PaliGemma, Mistral 3
# image_token_index; Qwen2/2.5/3-VL image, video, vision_start, vision_end_token_id; Gemma 3n boi/eoi_token_id.
CONFIG_MARKER = re.compile(r"(image|video|vision_start|vision_end|boi|eoi)_token_(id|index)")
CONFIG_IDS = "toolbox_config_image_ids"  # where load_processor keeps the config's ids on the processor


def config_image_ids(mc) -> set[int]:
    """The ids the model config's fields give the image tokens and markers (the ids the model itself reads)."""
    doc = mc.to_dict() if hasattr(mc, "to_dict") else dict(mc)
    return {v for k, v in doc.items() if CONFIG_MARKER.fullmatch(k) and isinstance(v, int) and v >= 0}


def image_token_ids(proc) -> set[int]:
    """The ids of the tokens an image becomes and of its start/end markers (Gemma 3: image, boi, eoi; Qwen-VL:
    image_pad, video_pad, vision_start, vision_end): from the processor's and tokenizer's named tokens, the
    model config's fields where load_processor read them, and the families' marker strings."""
    tok = proc.tokenizer
    added = tok.get_added_vocab()
    ids = set(getattr(proc, CONFIG_IDS, ()))

    def add(t):
        i = tok.convert_tokens_to_ids(t)
        if isinstance(i, int) and i != tok.unk_token_id:
            ids.add(i)

    for owner in (proc, tok):
        for attr in every_family("token_attrs"):
            t = getattr(owner, attr, None)
            if isinstance(t, str):
                add(t)
            i = getattr(owner, attr + "_id", None)
            if isinstance(i, int) and i >= 0:
                ids.add(i)
    for t in every_family("image_markers"):
        if t in added:
            add(t)
    return ids


def _image_bound(proc) -> int | None:
    """The most tokens one image can become with this processor, or None: unknown (every row is measured)."""
    if isinstance(getattr(proc, "image_seq_length", None), int):  # Gemma 3: fixed
        return proc.image_seq_length
    ip = proc.image_processor
    merge, patch, hi = getattr(ip, "merge_size", None), getattr(ip, "patch_size", None), getattr(ip, "max_pixels", None)
    size = getattr(ip, "size", None)
    hi = hi or getattr(size, "longest_edge", None) or (size.get("longest_edge") if isinstance(size, dict) else None)
    return hi // (patch * merge) ** 2 + 1 if merge and patch and hi else None


def cut_image(proc, msgs: list, text: str, images: list, max_len: int, bound: int | None,
              responses: bool = True) -> str | None:
    """Why data.max_seq_length cuts into this row's image tokens (the model would fail on the batch), or (loss on
    the responses) cuts all of its answer (no target left: a batch of such rows has a NaN loss); None if neither.
    Rows whose text and images' most tokens fit are not processed; the others go through the processor with
    blank images of the rows' own sizes (read from each file's header, nothing decoded)."""
    from PIL import Image

    from toolbox_train.data.images import image_parts, image_size

    n = len(images)
    if not n:
        return None
    if bound is not None:
        text_len = len(proc.tokenizer(text, add_special_tokens=False)["input_ids"])
        if text_len + n * (bound + 8) <= max_len:
            return None
    blank = [Image.new("RGB", image_size(src)) for src in images]
    ids = proc(text=[text], images=[blank], add_special_tokens=False)["input_ids"][0]
    marks = image_token_ids(proc)
    last = max((j for j, t in enumerate(ids) if t in marks), default=-1)
    if last >= max_len:
        return (f"data.max_seq_length {max_len} cuts into the row's image tokens (the row is {len(ids)} tokens, its "
                f"last image token at {last + 1}); raise it, or lower the images' resolution (vision.max_pixels)")
    first = next((k for k, m in enumerate(msgs) if m["role"] == "assistant"), None)
    if not responses or first is None:
        return None
    k = sum(image_parts(m["content"]) for m in msgs[:first])
    prompt = proc.apply_chat_template(msgs[:first], tokenize=False, add_generation_prompt=True)
    start = len(proc(text=[prompt], images=[blank[:k]] if k else None, add_special_tokens=False)["input_ids"][0])
    if start < max_len:
        return None
    return (f"data.max_seq_length {max_len} leaves none of the row's answer (it starts at token {start + 1}, after "
            f"the image tokens): nothing to learn from; raise it, or lower the images' resolution (vision.max_pixels)")


def row_problems(proc, rows, locate, max_len: int | None = None, responses: bool = True) -> list[tuple[str, str]]:
    """(where, why) of each image row the processor's chat template cannot take: it fails, or it renders
    another number of image markers than the row has images (Qwen's processor accepts two images for one
    marker; the model fails later), or its turns are not prefixes of the whole (the labels need them); and
    with `max_len`, a row whose image tokens data.max_seq_length would cut (cut_image)."""
    bad = []
    bound = _image_bound(proc) if max_len else None
    for i, row in enumerate(rows):
        msgs, n = row["messages"], len(row.get("images") or [])  # a text source of a mixture has none
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
            else:
                why = cut_image(proc, msgs, text, row.get("images") or [], max_len, bound, responses) \
                    if max_len else None
                if why:
                    bad.append((locate(i), why))
        except Exception as exc:  # jinja2's TemplateError (raise_exception), or no template at all
            bad.append((locate(i), f"the processor's chat template rejects this conversation: {first_line(exc)[:200]}"))
    return bad


def _processor_json(folder: str) -> dict:
    """The image processor's settings in the model folder (processor_config.json's image_processor, or
    preprocessor_config.json), read as JSON: no processor built."""
    import json
    from pathlib import Path

    for name in ("processor_config.json", "preprocessor_config.json"):
        f = Path(folder) / name
        if f.is_file():
            try:
                doc = json.loads(f.read_text())
            except (OSError, ValueError):
                continue
            doc = doc.get("image_processor", doc) if isinstance(doc, dict) else {}
            if isinstance(doc, dict):
                return doc
    return {}


def _pixel_range(folder: str, want: dict | None) -> tuple[int, int]:
    """Qwen-VL's image processor's (min_pixels, max_pixels): `want` (vision.min/max_pixels), else its settings."""
    ip = {**_processor_json(folder), **(want or {})}
    size = ip.get("size") if isinstance(ip.get("size"), dict) else {}
    return (ip.get("min_pixels") or size.get("shortest_edge") or 56 * 56,
            ip.get("max_pixels") or size.get("longest_edge") or 28 * 28 * 1280)


def tokens_per_image(mc, folder: str, want: dict | None = None) -> str | None:
    """How many tokens an image becomes, from the config and the processor's settings (`want`: vision.min_pixels /
    max_pixels where set), or None: unknown."""
    v = getattr(mc, "vision_config", None)
    if getattr(mc, "mm_tokens_per_image", None):  # Gemma 3: fixed, the image resized to the tower's size
        size = getattr(v, "image_size", None)
        return f"{mc.mm_tokens_per_image} tokens per image" + (f" ({size}x{size} pixels)" if size else "")
    merge, patch = getattr(v, "spatial_merge_size", None), getattr(v, "patch_size", None)
    if merge and patch:  # Qwen-VL: by resolution, between the processor's min and max pixels
        lo, hi = _pixel_range(folder, want)
        per = (patch * merge) ** 2
        return (f"{max(1, lo // per)}-{hi // per} tokens per image by its resolution (min_pixels {lo:,}, "
                f"max_pixels {hi:,}: {per} pixels a token)")
    return None


def patches_per_image(mc, folder: str, want: dict | None = None) -> int:
    """The patches an image gives the tower, at most (Qwen-VL: at max_pixels, before the merger), or 0: unknown."""
    v = getattr(mc, "vision_config", None)
    patch = getattr(v, "patch_size", None)
    if not patch:
        return 0
    if getattr(v, "spatial_merge_size", None):
        return _pixel_range(folder, want)[1] // patch ** 2
    size = getattr(v, "image_size", None)
    return (size // patch) ** 2 if size else 0


def plan_note(cfg, mc, folder: str, tower_params: int) -> str:
    """`--plan`'s line on a vision-language model: image tokens, the tower, which parts train."""
    tokens = tokens_per_image(mc, folder, budget(cfg)) or "tokens per image unknown for this family"
    trains = ", ".join(cfg.vision.train)
    frozen = "vision" not in cfg.vision.train and "projector" not in cfg.vision.train
    patches = patches_per_image(mc, folder, budget(cfg))
    counted = (" (vision.train trains them: their gradients and optimizer state counted" + (
        f", and the tower's activations at {patches:,} patches an image, one image a row" if "vision" in
        cfg.vision.train else "") + ")")
    return (f"vision-language model ({mc.model_type}): image rows give {tokens}, inside data.max_seq_length; "
            f"vision tower and projector {tower_params:,} parameters, counted as "
            + ("frozen weights" if frozen else "weights" + counted) + f"; vision.train: {trains}")
