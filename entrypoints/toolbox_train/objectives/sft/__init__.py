"""SFT (`objective: sft`): next-token loss on text, instruction or chat rows (TRL's SFTTrainer)."""

from __future__ import annotations

from toolbox_train.units.objective import Objective

UNIT = Objective("sft", "next-token loss on text, alpaca or chat rows (the format detected)", token_loss=True,
                 needs_trl=False, default=True)
