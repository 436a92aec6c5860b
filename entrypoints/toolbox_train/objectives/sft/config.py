"""SFT's TRL config: the shared arguments (training/arguments.py) plus SFTConfig's own (sequence
length, packing, the loss masking data.train_on asks for)."""

from __future__ import annotations

from toolbox_train.planning.run import Dist, ResolvedRun
from toolbox_train.training.arguments import common_args


def sft_args(p: ResolvedRun, dist: Dist, fmt: str = "text"):
    """`fmt`: the data format (data/dataset.py) the loss masking follows (data.train_on)."""
    from trl import SFTConfig

    c = p.cfg
    responses = c.data.train_on == "responses"
    # TRL's own masks: assistant turns through the chat template's {% generation %} markers (TRL swaps in its
    # training template for the models it knows; planning/preflight.py refuses the others before loading),
    # completions of prompt/completion rows (alpaca). Text rows have neither: every token.
    return SFTConfig(**common_args(p, dist), max_length=c.data.max_seq_length, packing=c.data.packing,
                     shuffle_dataset=c.data.shuffle, dataset_text_field="text", use_liger_kernel=p.liger,
                     assistant_only_loss=responses and fmt == "messages",
                     completion_only_loss=responses and fmt == "alpaca",
                     # None: the model config's own (TRL's default); 0.0 turns the router loss off
                     router_aux_loss_coef=None if c.train.router_aux_loss_coef == "auto" else c.train.router_aux_loss_coef)
