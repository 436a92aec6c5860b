"""The sampler: a unit of its own that the objectives which generate while they train share.

Its hooks, called from theirs: its section fields (declare), the sampler picked once (resolve:
`extras`, recorded in the resolved run), what can run here (prepare), its KV cache (memory), and TRL's
arguments and the compiled decoding (build).

  sampler   its fields, `pick` (auto resolved), `merge` (LoRA merged for generation), `refusal`, the KV
            cache and merged weights the memory plan counts
  trainer   TRL's generation arguments for the picked sampler, the compiled static-cache decoding, the
            compiled loop in TRL's place and the merged-LoRA generation (`mixins`)
  decode    the compiled decoding loop (`generation: compiled`) and what it can serve
"""
