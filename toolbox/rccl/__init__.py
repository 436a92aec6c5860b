"""RCCL for gfx1151: the ABI check, the one-HIP-runtime check and the patch-series verifier."""
