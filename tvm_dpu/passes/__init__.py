"""Relax passes: the DPU pattern table, DPU/CPU partitioning and the partition report."""
from .partition import LONE_OP_MAX, partition, partition_detailed, partition_for_dpu
from .patterns import dpu_patterns, pattern_names, register_dpu_patterns
from .report import NodeReport, PartitionReport

__all__ = [
    "LONE_OP_MAX",
    "NodeReport",
    "PartitionReport",
    "dpu_patterns",
    "partition",
    "partition_detailed",
    "partition_for_dpu",
    "pattern_names",
    "register_dpu_patterns",
]
