"""Multi-node training over SSH: `toolbox cluster launch|check`."""
