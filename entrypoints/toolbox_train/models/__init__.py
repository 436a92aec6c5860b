"""What is known of a model before it loads: the model-family table, the model folder and its weight
files, the LoRA targets, and the memory arithmetic from config.json alone.

  families     the model-family table: one entry per config.json model_type, read by every module below
  arithmetic   peak device memory of a training setting (no torch)
  tower        a vision-language model's tower and projector in that arithmetic
  weights      cheap integrity checks of weight and checkpoint files
  lora         the PEFT LoRA config (which modules get adapters), adapter checks
"""
