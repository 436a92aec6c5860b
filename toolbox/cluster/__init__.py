"""Multi-node training over SSH: `toolbox cluster launch` and `toolbox cluster check`."""
