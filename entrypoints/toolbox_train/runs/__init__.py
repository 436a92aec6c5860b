"""The run folder (output.dir): what a run writes and a later command reads back.

  folder       its files (summary, metrics, resolved config), read by export, evaluate and bench
  checkpoints  whole checkpoints only: staging, rename, rotation, the newest complete one
  resume       whether a checkpoint belongs to this config (finetune --resume)
"""
