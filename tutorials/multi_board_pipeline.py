"""
Split a model over several boards and pipeline frames through them
==================================================================

When one board is not fast enough, cut the network into stages, one per board, and stream frames through them
(the PYNQ-cluster paper, shared/seeds/002). tvm-dpu plans the cut at op granularity from the timing model and a
link model, compiles each stage for its board, and runs the stages either on threads of this process (the
"local" executor: each stage on its own emulated DPU) or as Ray actors, one per board. The pipelined output is
bit-identical to the single-board run.

Set ``TVM_DPU_TUTORIAL_SMALL=1`` (or pass ``--small``) for the reduced model and fewer frames.
"""
import os
import sys
import tempfile

SMALL = bool(os.environ.get("TVM_DPU_TUTORIAL_SMALL")) or "--small" in sys.argv

######################################################################
# Compile once
# ------------
# An ordinary single-board compile: the pipeline is cut from this model's quantized graph, so every stage
# computes exactly what the single board computes.
import numpy as np

import tvm_dpu
from tvm_dpu import zoo
from tvm_dpu.pipeline.model import PipelineModel, boards_for

reduced = True  # the full-size ResNet-50 works the same way; it takes a minute longer to compile
model_proto = zoo.build_model("resnet50", reduced=reduced)
frames = [zoo.random_input("resnet50", reduced=reduced, seed=s) for s in range(4 if SMALL else 12)]
single = tvm_dpu.build(model_proto, arch="ultra96", calibration=frames[:2], progress=False)

######################################################################
# Plan three boards and compile the stages
# ----------------------------------------
# ``boards_for`` makes the boards from presets (one for all, or one per board: boards may differ);
# the planner minimises the slowest stage, counting what each stage sends to the next over the link.
boards = boards_for("ultra96", 3)
pipe = PipelineModel.from_model(single, boards, link="serial-8.5g")
print(pipe.table())

######################################################################
# Stream frames locally
# ---------------------
# ``run_stream`` keeps up to ``max_in_flight`` frames inside the pipeline and yields outputs in frame order.
outputs = list(pipe.run_stream(frames, max_in_flight=3))
same = all(np.array_equal(o[0], single.run(x)[0]) for o, x in zip(outputs, frames))
print(f"local executor: {len(outputs)} frames, bit-identical to the single board: {same}")
assert same
pipe.close()

######################################################################
# Deploy: one artifact per board
# ------------------------------
# ``save`` writes ``stage<i>.tvmdpu`` and ``pipeline.json`` (the stages, what each sends, the sha256 of each
# artifact); ``tvm-dpu run OUTDIR/pipeline.json`` runs it from the command line.
workdir = tempfile.TemporaryDirectory(prefix="pipeline_")  # removed when the script ends
path = pipe.save(workdir.name)
print(f"wrote {path} and {len(pipe.stages)} stage artifacts")

######################################################################
# The same code on a Ray cluster
# ------------------------------
# ``executor="ray"`` runs each stage in a Ray actor that takes one ``dpu_board`` resource. On a real cluster,
# start every board's node with ``ray start --address=HEAD --resources='{"dpu_board": 1, "dpu_board:zu3eg": 1}'``
# (its kind: the board's part, or its DPU arch), run the driver with ``RAY_ADDRESS=HEAD`` and load with
# ``device="pynq"`` so each actor drives its board's DPU: the stages are placed one per node, each on a board of
# its kind, and a stage whose actor dies is restarted with its frames replayed. Here, with no ``RAY_ADDRESS``,
# ``ray.init()`` starts a local cluster whose "boards" are emulators. (Ray is the optional extra
# ``pip install 'tvm-dpu[cluster]'``.)
try:
    import ray
except ImportError:
    ray = None
    print("Ray is not installed: skipping the Ray part (pip install 'tvm-dpu[cluster]')")
if ray is not None:
    with PipelineModel.load(path, executor="ray") as cluster_pipe:
        ray_outputs = list(cluster_pipe.run_stream(frames, max_in_flight=3))
    same = all(np.array_equal(a[0], b[0]) for a, b in zip(ray_outputs, outputs))
    print(f"ray executor: {len(ray_outputs)} frames, identical to the local run: {same}")
    assert same
