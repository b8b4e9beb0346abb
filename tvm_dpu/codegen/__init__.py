"""Code generation: tiling under bank capacity, DDR/bank allocation, instruction emission with dependency tokens,
ISA encoding. Public entry points (compiler.py): `compile_graph_fused` (a fusion plan, types.FusionPlan) and
`compile_graph` (the same path with a plan of single ops); `fused.emittable` says whether a fused group has a
one-pipeline emitter that fits the banks (the fusion search asks it too)."""
