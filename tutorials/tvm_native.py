"""
Compile for the DPU with TVM's own API
======================================

tvm-dpu is a TVM plugin: ``import tvm_dpu`` registers the ``"dpu"`` target, the ``"dpu"`` Relax pipeline and the
``relax.ext.dpu`` BYOC codegen. This tutorial uses only TVM's spellings: import ONNX with
``tvm.relax.frontend.onnx``, partition, ``tvm.compile``, ``export_library``, ``tvm.runtime.load_module`` and the
Relax VM. The DPU machine code and weights live inside TVM's module, so the exported ``.so`` is the whole model.

Set ``TVM_DPU_TUTORIAL_SMALL=1`` (or pass ``--small``) for fewer calibration samples.
"""
import os
import subprocess
import sys
import tempfile

SMALL = bool(os.environ.get("TVM_DPU_TUTORIAL_SMALL")) or "--small" in sys.argv

######################################################################
# Import an ONNX model with TVM
# -----------------------------
# Any ONNX CNN works; here the bundled ``mixed_cnn`` (ResNet blocks around layers the DPU cannot run).
import numpy as np
import onnx
import tvm
from tvm import relax
from tvm.relax.frontend.onnx import from_onnx

import tvm_dpu  # registers the "dpu" target, pipeline and codegen
from tvm_dpu import zoo

model = zoo.build_model("mixed_cnn")
mod = from_onnx(model)
x = zoo.random_input(model, seed=7)
calibration = [zoo.random_input(model, seed=s) for s in range(2 if SMALL else 8)]

######################################################################
# Partition (optional) and compile
# --------------------------------
# ``tvm_dpu.partition_for_dpu`` is the BYOC partitioning (``FuseOpsByPattern`` with the DPU pattern table, then
# ``MergeCompositeFunctions``): DPU-capable regions become functions with ``Codegen="dpu"``. The ``"dpu"``
# pipeline calibrates and quantizes each of them, generates its DPU program, and ``RunCodegen`` embeds the program
# in TVM's module; LLVM compiles the rest. ``tvm.compile(mod, target="dpu")`` alone also works (default arch,
# random calibration with a warning).
partitioned = tvm_dpu.partition_for_dpu(mod, "zcu102")
pipeline = relax.get_pipeline("dpu", arch="zcu102", calibration=calibration, fusion="optimal")
ex = tvm.compile(partitioned, target="dpu", relax_pipeline=pipeline)
y = relax.VirtualMachine(ex, tvm.cpu())["main"](tvm.runtime.tensor(x)).numpy()
print("in-process output:", y.round(4))

######################################################################
# Export, then load in a fresh process
# ------------------------------------
# ``export_library`` writes one shared object holding the CPU code and every DPU program. On the deploying side
# ``import tvm_dpu`` provides the DPU runtime; ``tvm_dpu.set_device`` chooses the emulator (here) or a Pynq
# board (``tvm_dpu.set_device("pynq", bitfile="dpu.bit")``).
workdir = tempfile.TemporaryDirectory(prefix="tvmdpu_tutorial_")  # removed when the script ends
tmp = workdir.name
so = os.path.join(tmp, "mixed_cnn.so")
ex.export_library(so)
np.save(os.path.join(tmp, "x.npy"), x)
print(f"exported {so}: {os.path.getsize(so)} bytes")
deploy = f"""
import numpy as np, tvm, tvm_dpu
from tvm import relax
tvm_dpu.set_device("emulator")
lib = tvm.runtime.load_module({so!r})
vm = relax.VirtualMachine(lib, tvm.cpu())
np.save({os.path.join(tmp, 'y.npy')!r}, vm["main"](tvm.runtime.tensor(np.load({os.path.join(tmp, 'x.npy')!r}))).numpy())
"""
subprocess.run([sys.executable, "-c", deploy], check=True)
y_fresh = np.load(os.path.join(tmp, "y.npy"))
print("fresh process output is bit-identical:", bool(np.array_equal(y_fresh, y)))
assert np.array_equal(y_fresh, y)

######################################################################
# The same model through ``tvm_dpu.build``
# ----------------------------------------
# ``tvm_dpu.build`` is a convenience over exactly this path (it calls ``tvm.compile`` with the ``"dpu"``
# pipeline) that adds the partition report, timing model and the ``.tvmdpu`` artifact around the same code.
compiled = tvm_dpu.build(model, arch="zcu102", calibration=calibration, fusion="optimal", progress=False)
print("tvm_dpu.build gives the same output:", bool(np.array_equal(compiled.run(x)[0], y)))
assert np.array_equal(compiled.run(x)[0], y)
