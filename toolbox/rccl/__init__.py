"""RCCL for gfx1151: the ABI check and the patch-series verifier."""
