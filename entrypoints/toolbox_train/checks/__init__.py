"""Checks that run before or beside training: the in-image health probe (doctor), the tokenizer
checks over every row before anything is written (preflight), and the collective-communication
test (the `rccl-check` console script)."""
