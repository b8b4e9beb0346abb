"""Code generation: tiling under bank capacity, DDR/bank allocation, instruction emission with dependency tokens,
ISA encoding. Public entry points: `compile_graph` (op by op), `compile_graph_fused` / `compile_with_fusion` (a
fusion plan), and `group_fits` (whether a fused group's tiles fit the banks; used by the fusion cost)."""
