"""Quantization: fixed-point primitives (`fixpoint`), DPU constraints (`rules`), calibration statistics
(`calibration`), float XGraph -> int8 XGraph (`quantize`) and pre-quantized QDQ ONNX import (`qdq`).

    >>> stats = collect_stats(graph_f, batches)            # float graph on user data
    >>> graph_q = quantize_graph(graph_f, stats)           # int8 graph the DPU runs
    >>> graph_q = calibrate(graph_f, batches)              # both in one call
    >>> model_f, fix_points = strip_qdq(onnx_model)        # QDQ model -> float model + fix_points (overrides)

The high-level names are loaded on first use: `xgraph` imports `quant.fixpoint` / `quant.rules` while it is itself
being imported, and the calibration code imports `xgraph`, so importing them here eagerly would be circular.
"""
from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "CalibrationStats": "calibration",
    "TensorStats": "calibration",
    "collect_stats": "calibration",
    "choose_fix_point": "calibration",
    "minmax_fix_point": "calibration",
    "calibrate": "quantize",
    "QuantReport": "quantize",
    "QuantResult": "quantize",
    "TensorFix": "quantize",
    "quantize_graph": "quantize",
    "quantize_with_report": "quantize",
    "strip_qdq": "qdq",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module_name = _EXPORTS.get(name)
    if module_name is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module = importlib.import_module(f"{__name__}.{module_name}")
    value = getattr(module, name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
