"""What the image ships for training: `finetune`, `launch`, `rccl-check`.

Kept apart from the `toolbox` package (the image builder) so the image
needs nothing of the builder to train.
"""
