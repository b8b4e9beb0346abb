"""
Calibration and an accuracy check
=================================

The DPU computes in int8 with power-of-two scales: every tensor gets a *fix_point* (value = q * 2**-fix_point).
Calibration runs the float model on sample inputs and picks each fix_point; this tutorial compares the two
methods tvm-dpu offers and measures the int8 model against the float model (onnxruntime) on held-out inputs.

Set ``TVM_DPU_TUTORIAL_SMALL=1`` (or pass ``--small``) for a reduced model and fewer samples.
"""
import os
import sys

SMALL = bool(os.environ.get("TVM_DPU_TUTORIAL_SMALL")) or "--small" in sys.argv

######################################################################
# Data
# ----
# The zoo's MobileNetV2 with seeded random weights, and standard-normal images. With your own model, use a few
# hundred images of the real input distribution for calibration and a separate set for the check.
import numpy as np
import onnxruntime as ort

import tvm_dpu
from tvm_dpu import zoo

model = zoo.build_model("mobilenetv2", reduced=True)
n_calib, n_test = (2, 3) if SMALL else (32, 32)
calibration = [zoo.random_input(model, seed=s) for s in range(n_calib)]
test = [zoo.random_input(model, seed=10_000 + s) for s in range(n_test)]
session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
reference = [session.run(None, {"input": x})[0] for x in test]

######################################################################
# Two calibration methods
# -----------------------
# ``method="minmax"`` takes the largest fix_point that never saturates on the samples; ``method="mse"`` (the
# default) searches the fix_points around it for the smallest quantization error, the DNNVM / Angel-Eye approach,
# which may clip a few outliers for a finer step on everything else. Which one is better depends on the model
# and the data: measure it, as below.


def cosine(a, b):
    return float(np.dot(a.ravel(), b.ravel()) / (np.linalg.norm(a) * np.linalg.norm(b) + 1e-12))


results = {}
for method in ("minmax", "mse"):
    compiled = tvm_dpu.build(model, arch="zcu104", calibration=calibration, method=method, progress=False)
    outputs = [compiled.run(x)[0] for x in test]
    cos = [cosine(y, r) for y, r in zip(outputs, reference)]
    top1 = np.mean([int(np.argmax(y)) == int(np.argmax(r)) for y, r in zip(outputs, reference)])
    results[method] = (float(np.mean(cos)), float(np.min(cos)), float(top1))
    print(f"{method:7s} mean cosine {np.mean(cos):.4f}  worst {np.min(cos):.4f}  top-1 agreement {top1:.0%}")

######################################################################
# Reading the numbers
# -------------------
# Cosine similarity near 1 means the int8 logits point the same way as the float ones; top-1 agreement is the
# share of test inputs whose arg-max class is unchanged. If they are low for your model, calibrate on more (and
# more representative) data, or fix a tensor's fix_point by hand with ``build(..., fix_points={name: fp})``.
assert all(mean > 0.9 for mean, _, _ in results.values())
