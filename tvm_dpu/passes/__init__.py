"""Relax passes, the Relax-facing side: the DPU pattern table, DPU/CPU partitioning and the partition report
(`partition` returns a tvm_dpu.types.PartitionReport); the conversions of a partition into an XGraph
(`from_relax`) and of its tensors to ONNX names (`qdq_names`). What compiles a partition is tvm_dpu.backend."""
from .partition import LONE_OP_MAX, partition, partition_detailed, partition_for_dpu
from .patterns import dpu_patterns, pattern_names, register_dpu_patterns

__all__ = [
    "LONE_OP_MAX",
    "dpu_patterns",
    "partition",
    "partition_detailed",
    "partition_for_dpu",
    "pattern_names",
    "register_dpu_patterns",
]
