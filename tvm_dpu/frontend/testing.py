"""Helpers for tests of the frontend (and of later stages that start from ONNX): build a small ONNX model with
``onnx.helper``, run it with onnxruntime, run a Relax module on TVM's LLVM CPU backend."""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17


def make_model(nodes: Sequence[onnx.NodeProto], inputs: dict[str, Sequence[int | str | None]],
               outputs: dict[str, Sequence[int | str | None] | None], initializers: dict[str, np.ndarray] | None = None,
               *, opset: int = OPSET, ir_version: int = 8) -> onnx.ModelProto:
    """A float32 ONNX model. ``outputs`` values may be None (shape filled by ONNX shape inference)."""
    inits = [numpy_helper.from_array(np.asarray(v), k) for k, v in (initializers or {}).items()]
    ins = [helper.make_tensor_value_info(k, TensorProto.FLOAT, list(v)) for k, v in inputs.items()]
    outs = [helper.make_tensor_value_info(k, TensorProto.FLOAT, None if v is None else list(v))
            for k, v in outputs.items()]
    graph = helper.make_graph(list(nodes), "test", ins, outs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=ir_version)
    if any(v is None for v in outputs.values()):
        inferred = onnx.shape_inference.infer_shapes(model)
        known = {vi.name: vi for vi in list(inferred.graph.value_info) + list(inferred.graph.output)}
        for out in model.graph.output:
            if out.name in known and known[out.name].type.tensor_type.HasField("shape"):
                out.type.CopyFrom(known[out.name].type)
    return model


def run_onnxruntime(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    """Outputs of ``model`` on onnxruntime's CPU provider."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


def run_relax(mod, *arrays: np.ndarray) -> list[np.ndarray]:
    """Compile ``mod`` with ``tvm.compile(target="llvm")`` and run ``main`` on ``arrays``."""
    import tvm
    from tvm import relax

    ex = tvm.compile(mod, target="llvm")
    vm = relax.VirtualMachine(ex, tvm.cpu())
    out = vm["main"](*[tvm.runtime.tensor(np.ascontiguousarray(a)) for a in arrays])
    if isinstance(out, tvm.runtime.Tensor):
        return [out.numpy()]
    return [o.numpy() for o in out]
