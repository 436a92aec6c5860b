"""After training: the `export-model` (model) and `evaluate` console scripts, llama.cpp's tools they
run as separate processes (llamacpp), and the model card written beside every model a run gives (card)."""
