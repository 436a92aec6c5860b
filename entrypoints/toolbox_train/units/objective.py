"""What an objective unit declares (objectives/<name>/__init__.py's `UNIT`) and the hooks the run calls
on it, read by the schema, the resolvers, the checks, the memory planner, model loading and the docs.
No TRL, torch or transformers here.

  declare   its train.yaml section, the rows it trains on, its model head, its reference model, metrics
  resolve   its extras (`resolve(ctx)`: a dict), frozen in the resolved run (`ResolvedRun.extras`) and
            written to config.resolved.yaml; asked once, when the backend is known
  memory    what it adds to the memory plan (`memory(ctx, extras, setting, shape)`: a sampler's KV
            cache, a teacher's weights), the Setting and a note for the banner
  prepare   its checks that need the tokenizer and the rows, and what its trainer is given
            (`prepare(run, tok, sets)`: `ResolvedRun.inputs`), once, before the model loads
  build     `objectives/<name>/trainer.py`'s `build(run, dist, model, tok, peft_cfg, train, eval, callbacks)`
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from pydantic import BaseModel, ConfigDict

REFERENCE_TEXT = {"none": "no reference model", "adapter": "reference: the base with the adapter disabled",
                  "copy": "reference: a frozen copy of the model"}


class Section(BaseModel):
    """An objective's train.yaml section (under its name): unknown keys refused."""
    model_config = ConfigDict(extra="forbid", validate_assignment=True, frozen=True)


# The model class of each head (transformers' auto class, PEFT's task type, what from_pretrained is given).
HEADS = {"causal-lm": ("AutoModelForCausalLM", "CAUSAL_LM", {}),
         # a causal LM's vision-language form: SFT on image rows (models/lora.head)
         "image-text-to-text": ("AutoModelForImageTextToText", "CAUSAL_LM", {}),
         "sequence-classification": ("AutoModelForSequenceClassification", "SEQ_CLS", {"num_labels": 1})}


@dataclass(frozen=True)
class Context:
    """What a unit's resolve and memory hooks are told of the run: the config, its folder, the backend
    and whether it trains on a GPU (or plans for one), the ranks."""
    cfg: Any
    base: Path
    backend: str
    gpu: bool
    world_size: int = 1
    fsdp: bool = False  # the ranks shard the parameters (accelerate's FSDP)


def no_reference(cfg) -> str:
    return "none"


def policy_reference(cfg) -> str:
    """'adapter' (LoRA/QLoRA: the base with the adapter disabled, no second copy in memory) or
    'copy' (full fine-tuning: a frozen copy of the starting model, which the memory plan counts)."""
    return "copy" if cfg.method == "full" else "adapter"


def default_backend(cfg) -> str | None:
    return None  # backend auto's own rule (planning/run.py: Unsloth where it runs)


@dataclass(frozen=True)
class Objective:
    """One objective (`objective: NAME`): its folder objectives/NAME/, its trainer
    `toolbox_train.objectives.NAME.trainer` (`build(...)`, which units.registry.build imports by name)."""

    name: str
    what: str  # one line for the docs and --help: what it trains the model to do
    section: type[Section] | None = None  # its train.yaml section, under `name`
    data_format: str | None = None  # the TRL dataset type it trains on (data.format); None: detected (text rows)
    reference: Callable[[Any], str] = no_reference  # 'none', 'adapter' or 'copy' (REFERENCE_TEXT)
    rows: int = 1  # sequences per example in one forward (chosen and rejected: 2), for the memory plan
    needs_trl: bool = True  # needs TRL >= planning.inputs.TRL_FOR_OBJECTIVES (the default objective runs on older ones)
    token_loss: bool = False  # the next-token loss: Liger, the LM head kernel, the router aux loss apply
    logits: bool = False  # reads the model's logits of every token (the memory plan counts them)
    extra_tokens: Callable[[Any], int] = lambda cfg: 0  # tokens the loss reads beyond data.max_seq_length
    auto_backend: Callable[[Any], str | None] = default_backend  # backend auto's pick, where it is the objective's
    unsloth: bool = True  # backend unsloth can run it
    head: str = "causal-lm"  # the model class (HEADS): causal-lm, or sequence-classification (one label: a score)
    describe: Callable[[dict], dict] = lambda section: section  # its section as the banner line shows it
    # what its TRL trainer logs that metrics.jsonl and the summary keep (TRL's names; `tools/*`: a family,
    # for metrics TRL names after the run's functions; training/trainer.py's Metrics matches them)
    metrics: tuple[str, ...] = ()
    default: bool = False  # `objective:` when the config names none (one unit)
    # the hooks (module docstring); None: the unit has nothing to add there
    resolve: Callable[[Context], dict] | None = None
    memory: Callable[[Context, dict, Any, Any], tuple[Any, str]] | None = None
    prepare: Callable[[Any, Any, Any], Any] | None = None
