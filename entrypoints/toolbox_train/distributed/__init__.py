"""Distributed launch: the `launch` console script (accelerate/torchrun over one or more nodes, or
Ray Train on a Ray cluster: ray_engine), the RDMA port and GID choice (rdma), and the LocalSGD
sync setting (sync)."""
