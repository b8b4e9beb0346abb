"""
Write a plugin for your own IP
==============================

The DPU cannot run a Sigmoid, so ``mixed_cnn`` keeps it on the CPU. Suppose your FPGA design has a small sigmoid
IP beside the DPU. A tvm-dpu plugin (Vitis AI's plugin mechanism) claims the ops the IP runs before DPU
partitioning, compiles each subgraph into bytes for the IP, and provides the runners: ``ref`` (numpy reference),
``sim`` (emulator of the IP) and ``run`` (the board). This one fits in about 40 lines.

Set ``TVM_DPU_TUTORIAL_SMALL=1`` (or pass ``--small``) for fewer calibration samples.
"""
import os
import sys

SMALL = bool(os.environ.get("TVM_DPU_TUTORIAL_SMALL")) or "--small" in sys.argv

######################################################################
# The plugin
# ----------
# The IP: int8 input with a fix_point chosen from calibration, a 256-entry sigmoid table, Q8 output.
import numpy as np

import tvm_dpu
from tvm_dpu import zoo
from tvm_dpu.plugins import Plugin, register_plugin


@register_plugin
class SigmoidIP(Plugin):
    name = "sigmoid_ip"  # the codegen is relax.ext.sigmoid_ip
    device = "sigmoid_ip"  # what reports show
    version = "1"  # an artifact runs only with the same plugin version installed

    def partition(self, graph):  # claim by type; filter_by_name / _by_template / filter(predicate) also exist
        return graph.filter_by_type("Sigmoid")

    def float_reference(self, subgraph, inputs):  # the calibration run computes the model with it
        return [1.0 / (1.0 + np.exp(-inputs[0]))]

    def compile(self, subgraph, calibration):  # -> the IP's parameters: the fix_point and the table
        max_abs = max(float(np.abs(s[0]).max()) for s in calibration)
        fp = int(np.clip(np.floor(np.log2(127.0 / max(max_abs, 1e-6))), -8, 12))
        table = np.round(256.0 / (1.0 + np.exp(-np.arange(-128, 128) * 2.0 ** -fp)))
        return bytes([fp & 0xFF]) + np.clip(table, 0, 256).astype("<u2").tobytes()

    def ref(self, payload, inputs):
        fp = np.int8(payload[0])
        table = np.frombuffer(payload[1:], dtype="<u2")
        q = np.clip(np.floor(inputs[0] * 2.0 ** fp + 0.5), -128, 127).astype(np.int64)
        return [(table[q + 128] / 256.0).astype(np.float32)]

    sim = ref  # this IP is a table lookup: its emulator is the reference


######################################################################
# Compile and run with the plugin
# -------------------------------
# ``plugins=[...]`` (or ``--options '{"plugins": "sigmoid_ip"}'`` on the command line) applies plugins in order
# before DPU partitioning. The partition report shows the Sigmoid on the IP.
model = zoo.build_model("mixed_cnn")
calib = [zoo.random_input(model, seed=s) for s in range(2 if SMALL else 8)]
compiled = tvm_dpu.build(model, arch="zcu102", calibration=calib, progress=False, plugins=["sigmoid_ip"])
print(compiled.partition_report.summary())
assert compiled.partition_report.node("branch_b.sigmoid").device == "sigmoid_ip"

x = zoo.random_input(model, seed=7)
y = compiled.run(x)[0]
y_cpu = tvm_dpu.build(model, arch="zcu102", calibration=calib, progress=False).run(x)[0]
print("output with the sigmoid IP:", y.round(4))
print("max difference to the float sigmoid on the CPU:", float(np.abs(y - y_cpu).max()))
assert float(np.abs(y - y_cpu).max()) < 0.05
