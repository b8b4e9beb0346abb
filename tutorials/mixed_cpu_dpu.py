"""
A mixed CPU/DPU model and its partition report
==============================================

Not every layer fits the DPU: the DPUCZDX8G has per-operator limits (kernel sizes, strides, activations, ...).
tvm-dpu keeps those layers on the CPU (compiled by TVM for LLVM), cuts the DPU-capable rest into subgraphs, and
tells you for every ONNX node where it runs and, for CPU nodes, the exact limit that kept it there.

Set ``TVM_DPU_TUTORIAL_SMALL=1`` (or pass ``--small``) for fewer calibration samples.
"""
import os
import sys

SMALL = bool(os.environ.get("TVM_DPU_TUTORIAL_SMALL")) or "--small" in sys.argv

######################################################################
# The model
# ---------
# ``mixed_cnn`` (also shipped as ``examples/mixed_cnn.onnx``) puts a 17x17 convolution, a Sigmoid, a lone ReLU
# between those two, and a Softmax head between DPU-friendly ResNet blocks.

import tvm_dpu
from tvm_dpu import zoo

model = zoo.build_model("mixed_cnn")

######################################################################
# Partition only
# --------------
# ``tvm_dpu.partition`` returns the Relax module with DPU functions split out and a per-node report; no
# calibration or code generation yet, so it is instant. ``tvm-dpu partition MODEL.onnx --arch zcu102`` prints
# the same table.
mod = tvm_dpu.from_onnx(model)
partitioned, report = tvm_dpu.partition(mod, "zcu102")
print(report.table())

cpu_nodes = [n for n in report.nodes if n.device == "cpu"]
print(f"\n{len(report.dpu_nodes)} nodes on the DPU in {report.subgraphs} subgraph(s); {len(cpu_nodes)} on the CPU:")
for n in cpu_nodes:
    print(f"  {n.name} ({n.op}): {n.reason}")

######################################################################
# Build and run the whole model
# -----------------------------
# The Relax VM runs the CPU part and calls the DPU subgraphs (here on the emulator) in between.
compiled = tvm_dpu.build(model, arch="zcu102", calibration=[zoo.random_input(model, seed=s)
                                                            for s in range(2 if SMALL else 8)], progress=False)
y = compiled.run(zoo.random_input(model, seed=7))[0]
print("output:", y.shape, "sum of softmax =", float(y.sum()))
assert abs(float(y.sum()) - 1.0) < 1e-3

######################################################################
# The report as data
# ------------------
# ``compiled.report()`` is JSON-ready: the partition, and for every DPU subgraph its instruction counts, DDR
# footprint and the fix_points of its inputs and outputs (what ``tvm-dpu compile`` writes to report.json).
rep = compiled.report()
for sg in rep["subgraphs"]:
    ins = ", ".join(f"{b['name']} fp={b['fix_point']}" for b in sg["inputs"])
    print(f"subgraph {sg['id']}: {sg['instruction_counts']} | inputs {ins} | DDR {sg['ddr_bytes']}")
