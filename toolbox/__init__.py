"""The host side: the `toolbox` command, which builds a stack's pinned image and runs training in it."""

__version__ = "0.1.0"
