"""The `toolbox` commands: one module per command group, each defining `register(subparsers)`."""
