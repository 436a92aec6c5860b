"""The training-side console scripts that run or check training: `finetune`, `launch`, `rccl-check`,
and the in-image health check that `toolbox doctor` runs.

  finetune         the objective's trainer over the resolved run (thin: the resolvers in planning/)
  finetune_report  the end of a run as a person reads it (summary, loss.png, output.export)
  launch           accelerate/torchrun over one or more nodes (same checks at the world size it starts)
  ray_train        Ray Train on a Ray cluster (launch --launcher ray)
  rccl_check       the collective-communication test
  health           the in-image health check (`toolbox doctor` runs it)
"""
