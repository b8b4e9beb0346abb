"""Model zoo: ONNX CNNs with the published topologies and seeded random weights, generated offline.

Only ``onnx.helper`` / ``onnx.numpy_helper`` are used (no downloads, no torch). Models are opset 17, IR version 8,
with one float32 NCHW input "input" and one output "output". The same (name, reduced, seed, batch, options) always
gives byte-identical models.

    >>> from tvm_dpu import zoo
    >>> model = zoo.build_model("resnet18", reduced=True)
    >>> x = zoo.random_input(model)
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx

from .graph_builder import GraphBuilder
from .models import REGISTRY, ModelInfo, Stages, Variant

MODELS: tuple[str, ...] = tuple(REGISTRY)

# Metadata keys written into every model (read back by stage_outputs and useful when inspecting a file).
META_NAME = "tvm_dpu.zoo.name"
META_REDUCED = "tvm_dpu.zoo.reduced"
META_SEED = "tvm_dpu.zoo.seed"
META_STAGES = "tvm_dpu.zoo.stages"

# Initializer inputs that are learned parameters, per op type (input index -> counted). Running BN statistics,
# Clip bounds and the Dropout ratio are not parameters and are left out, as in the published counts.
_PARAM_INPUTS: dict[str, tuple[int, ...]] = {"Conv": (1, 2), "Gemm": (1, 2), "BatchNormalization": (1, 2)}


def _info(name: str) -> ModelInfo:
    try:
        return REGISTRY[name]
    except (KeyError, TypeError):
        raise ValueError(f"unknown zoo model {name!r}; available: {', '.join(MODELS)}") from None


def _variant(name: str, reduced: bool) -> Variant:
    info = _info(name)
    return info.reduced if reduced else info.full


def input_shape(name: str, reduced: bool = False, batch: int = 1) -> tuple[int, int, int, int]:
    """NCHW shape of the model's input."""
    r = _variant(name, reduced).resolution
    return (batch, 3, r, r)


def build_model(name: str, *, reduced: bool = False, seed: int = 0, batch: int = 1, **options) -> onnx.ModelProto:
    """Build zoo model ``name`` (one of :data:`MODELS`) with weights drawn from ``numpy.random.default_rng(seed)``.

    ``reduced=True`` gives the small variant for fast tests (64x64 input, channels / 8, 10 classes, same op
    sequence). ``options`` are model-specific (googlenet: ``lrn=True`` inserts the two LRN layers).
    """
    info = _info(name)
    unknown = sorted(set(options) - set(info.options))
    if unknown:
        allowed = ", ".join(info.options) or "none"
        raise ValueError(f"zoo model {name!r} does not take option(s) {', '.join(unknown)} (accepted: {allowed})")
    if not isinstance(batch, int) or batch < 1:
        raise ValueError(f"batch must be a positive int, got {batch!r}")
    variant = info.reduced if reduced else info.full
    b = GraphBuilder(graph_name=name + ("_reduced" if reduced else ""), seed=seed)
    x = b.input("input", input_shape(name, reduced, batch))
    stages = Stages()
    out = info.fn(b, x, variant, stages, **options)
    meta = {META_NAME: name, META_REDUCED: str(bool(reduced)).lower(), META_SEED: str(seed),
            META_STAGES: ",".join(stages.names)}
    return b.build(out, meta)


def save_model(name: str, path: str | Path, **kw) -> Path:
    """Build ``name`` (keywords as :func:`build_model`) and write it to ``path``; returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    model = build_model(name, **kw)
    path.write_bytes(model.SerializeToString())
    return path


def save_zoo(outdir: str | Path, names: list[str] | tuple[str, ...] | None = None, reduced: bool = False) -> list[Path]:
    """Write each model of ``names`` (default: all) to ``outdir/<name>.onnx`` (``<name>_small.onnx`` if reduced)."""
    names = MODELS if names is None else tuple(names)
    for n in names:
        _info(n)  # fail before writing anything
    suffix = "_small" if reduced else ""
    return [save_model(n, Path(outdir) / f"{n}{suffix}.onnx", reduced=reduced) for n in names]


def random_input(name_or_model: str | onnx.ModelProto, seed: int = 0, *, reduced: bool = False) -> np.ndarray:
    """Standard-normal float32 input for a zoo model (by name, with ``reduced``) or for any single-input model."""
    if isinstance(name_or_model, onnx.ModelProto):
        graph = name_or_model.graph
        inits = {t.name for t in graph.initializer}
        inputs = [i for i in graph.input if i.name not in inits]
        if len(inputs) != 1:
            raise ValueError(f"random_input needs a model with one input, got {[i.name for i in inputs]}")
        dims = inputs[0].type.tensor_type.shape.dim
        if any(not d.HasField("dim_value") for d in dims):
            raise ValueError(f"random_input needs a static input shape; input {inputs[0].name!r} has a symbolic dim")
        shape = tuple(d.dim_value for d in dims)
    else:
        shape = input_shape(name_or_model, reduced)
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def stage_outputs(model: onnx.ModelProto) -> tuple[str, ...]:
    """Names of the tensors that end each stage of a zoo model (from its metadata; empty for other models)."""
    for entry in model.metadata_props:
        if entry.key == META_STAGES:
            return tuple(s for s in entry.value.split(",") if s)
    return ()


def count_parameters(model: onnx.ModelProto) -> int:
    """Number of learned parameters (conv / fc weights and biases, BN scale and shift) among the initializers."""
    sizes = {t.name: int(np.prod(t.dims)) for t in model.graph.initializer}
    counted: set[str] = set()
    for node in model.graph.node:
        for idx in _PARAM_INPUTS.get(node.op_type, ()):
            if idx < len(node.input) and node.input[idx] in sizes:
                counted.add(node.input[idx])
    return sum(sizes[n] for n in counted)


__all__ = ["MODELS", "build_model", "input_shape", "save_model", "save_zoo", "random_input", "stage_outputs",
           "count_parameters"]
