"""Everything about a stack (a YAML file of pins): reading, validating, its digest, pinning, locking.

- `source`: the YAML read with each field's file and line, `extends:`, `--set` overrides.
- `model`: the schema (pydantic, unknown keys refused): the top fields and the components' blocks.
- `resolved`: the `Stack` every command gets; `load`: `load_stack()` and the shipped stacks.
- `digest`: the stack's pins and their digest (the image tag), `stack.lock.yaml` in the image.
- `pinning`: first-use pins (ROCm tarball hash, AMD wheels, base digest) in the user's pins file.
- `python_lock`: the Python lock (`toolbox lock`): every Python package with its hashes, per stack.
- `wheel_index`: reading a PEP 503 wheel index; `bumping`: moving a stack's pins to new releases.

Nothing is imported here, so importing one module pulls in only what that module needs.
"""
