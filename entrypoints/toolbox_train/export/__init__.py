"""After training: the `export-model` (model) and `evaluate` console scripts, llama.cpp's tools they
run as separate processes (llamacpp), a vision model's projector input for llama.cpp (projector) and its
scoring on image rows (vision_eval), and the model card written beside every model a run gives (card)."""
