"""toolbox: pinned container images and training entrypoints for LLM fine-tuning."""

__version__ = "0.1.0"
