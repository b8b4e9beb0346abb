"""
Deploy an ONNX CNN to the DPU emulator
======================================

This tutorial compiles an ONNX ResNet for the Xilinx DPUCZDX8G of a ZCU102 board and runs it on tvm-dpu's
bit-exact instruction emulator: the DPU-capable layers become DPU machine code, the rest is compiled by TVM for
the CPU, and one object runs both.

Run it as a script. Set ``TVM_DPU_TUTORIAL_SMALL=1`` (or pass ``--small``) for the reduced model and fewer
calibration samples, as CI does.
"""
import os
import sys

SMALL = bool(os.environ.get("TVM_DPU_TUTORIAL_SMALL")) or "--small" in sys.argv

######################################################################
# Get a model
# -----------
# Any ONNX file works (``tvm_dpu.build("model.onnx", ...)``). Here the project's model zoo writes a ResNet-18
# with seeded random weights, so the tutorial needs no download. The reduced variant has the same layer sequence
# on a 64x64 input with fewer channels.
import numpy as np
import onnxruntime as ort

import tvm_dpu
from tvm_dpu import zoo

model = zoo.build_model("resnet18", reduced=SMALL)
print("input shape:", zoo.input_shape("resnet18", reduced=SMALL))

######################################################################
# Compile for the DPU
# -------------------
# ``arch`` names the DPU: a board (``zcu102``, ``zcu104``, ``kv260``, ``ultra96``), a core such as
# ``DPUCZDX8G_ISA1_B4096``, or an ``arch.json``. Calibration data chooses the power-of-two fix_point of every
# tensor; use images from your training distribution (here: random inputs, as the weights are random too).
calibration = [zoo.random_input(model, seed=s) for s in range(2 if SMALL else 8)]
compiled = tvm_dpu.build(model, target="dpu", arch="zcu102", calibration=calibration, progress=False)

for sg in compiled.report()["subgraphs"]:
    print(f"DPU subgraph {sg['id']}: {sg['ops']} ops, {sg['instructions']} instructions, "
          f"{sg['param_bytes']} parameter bytes")

######################################################################
# Run it and compare with the float model
# ---------------------------------------
# ``run`` takes a dict name -> array, a list in input order, or a single array. With ``set_verify(True)`` every
# DPU subgraph also runs the golden reference (an independent numpy int8 model) and counts differing elements:
# the emulator is bit-exact, so the count must be 0.
x = zoo.random_input(model, seed=1000)
compiled.set_verify(True)
y_dpu = compiled.run(x)[0]
mismatches = sum(r.mismatches for r in compiled.verify_results())
print("golden-reference mismatches:", mismatches)
assert mismatches == 0

session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
y_float = session.run(None, {"input": x})[0]
cos = float(np.dot(y_dpu.ravel(), y_float.ravel()) / (np.linalg.norm(y_dpu) * np.linalg.norm(y_float)))
print(f"cosine(DPU int8, float) = {cos:.4f}; top-1 DPU {int(np.argmax(y_dpu))}, float {int(np.argmax(y_float))}")

######################################################################
# Next steps
# ----------
# ``compiled.export("resnet18.tvmdpu")`` writes the deployable artifact (see the export tutorial), and the same
# flow is available from the shell::
#
#     tvm-dpu compile resnet18.onnx --arch zcu102 -o out -n resnet18
#     tvm-dpu run out/resnet18.tvmdpu --verify
