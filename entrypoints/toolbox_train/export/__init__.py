"""After training: the `export-model` (model) and `evaluate` console scripts, and llama.cpp's
tools they run as separate processes (llamacpp)."""
