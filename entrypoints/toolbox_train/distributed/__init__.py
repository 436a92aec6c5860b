"""Distributed launch: the `launch` console script (accelerate/torchrun over one or more nodes),
the RDMA port and GID choice (rdma), and the LocalSGD sync setting (sync)."""
