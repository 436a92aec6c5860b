"""The run's settings: train.yaml's schema (fields, files and lines; the objectives and their sections
from the objective registry), the experiment trackers, and what is read from the environment (LocalSGD sync, RDMA port and GID).

  schema       train.yaml (+ --set) -> TrainConfig
  errors       its validation errors as one line, each naming its file:line or flag
  tracking     output.report_to and the trackers' sections; the TrainingArguments they set
  sync         TOOLBOX_SYNC: DDP every step or LocalSGD
  rdma         the RDMA port and GID a node uses (the host's `toolbox cluster` picks them the same way)
"""
