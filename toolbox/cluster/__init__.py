"""Multi-node training over SSH: `toolbox cluster launch` and `toolbox cluster check`, and a Ray cluster on the same hosts (`toolbox cluster ray`)."""
