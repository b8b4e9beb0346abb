"""Calibration data in every form users give it, normalized to batches (one float32 array per model input)."""
from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from tvm_dpu.errors import DPUError, InputError
from tvm_dpu.feeds import arrays_by_name, check_array, input_shape_check, load_npz
from tvm_dpu.types import InputSpec

#: Random calibration batches used when the caller gives no data (with a warning: fix_points will be poor).
RANDOM_CALIBRATION_BATCHES = 2
#: The calibration value that asks for random inputs knowingly (no warning; e.g. the PassContext config
#: "relax.dpu.calibration" for a timing-only build).
RANDOM = "random"


def calibration_batches(calibration: Any, inputs: list[InputSpec], progress: bool = False) -> list[list[np.ndarray]]:
    """Normalize calibration data to a list of batches (one array per model input, in input order).

    Accepted: None (random normal inputs, with a warning), "random" (the same, chosen knowingly: no warning), an array or dict of arrays with the input shapes or with
    a leading sample axis (each sample becomes one batch), an .npz path, or an iterable of arrays / dicts.
    """
    chosen_random = isinstance(calibration, str) and calibration == RANDOM
    if calibration is None or chosen_random:
        if not chosen_random:
            warnings.warn("no calibration data: calibrating on random normal inputs; fix_points will not suit real "
                          "data (pass calibration=... or --calib FILE.npz)", stacklevel=3)
        rng = np.random.default_rng(0)
        return [[rng.standard_normal(s.shape).astype(np.float32) for s in inputs]
                for _ in range(RANDOM_CALIBRATION_BATCHES)]
    batches = _batches(calibration, inputs)
    _warn_if_uninformative(batches, inputs)
    return batches


def _warn_if_uninformative(batches: list[list[np.ndarray]], inputs: list[InputSpec]) -> None:
    for i, s in enumerate(inputs):
        lo = min(float(b[i].min()) for b in batches)
        hi = max(float(b[i].max()) for b in batches)
        if lo == hi:
            what = "all zero" if lo == 0 else f"constant ({lo:g})"
            warnings.warn(f"calibration data for input {s.name!r} is {what} in all {len(batches)} sample(s): the "
                          "fix_points will not suit real data; calibrate on representative inputs", stacklevel=4)


def _batches(calibration: Any, inputs: list[InputSpec]) -> list[list[np.ndarray]]:
    if isinstance(calibration, (str, Path)):
        calibration = load_npz(calibration, "calibration file",
                               check=input_shape_check(inputs, samples=True, what="calibration data for input"))
    if isinstance(calibration, np.ndarray) or isinstance(calibration, Mapping):
        arrays = _by_input(calibration, inputs)
        samples = []
        n = None
        per_input = []
        for a, s in zip(arrays, inputs):
            if tuple(a.shape) == tuple(s.shape):
                per_input.append([a])
            elif tuple(a.shape[1:]) == tuple(s.shape[1:]) and a.shape[0] % s.shape[0] == 0:
                k = s.shape[0]
                per_input.append([a[i:i + k] for i in range(0, a.shape[0], k)])
            elif tuple(a.shape[1:]) == tuple(s.shape):
                per_input.append([a[i] for i in range(a.shape[0])])
            else:
                raise InputError(f"calibration data for input {s.name!r} has shape {a.shape}; expected {s.shape} "
                                 f"or (N, ...) samples of it")
            n = len(per_input[-1]) if n is None else min(n, len(per_input[-1]))
        for i in range(n or 0):
            samples.append([check_array(s.name, np.reshape(p[i], s.shape), s.shape, "calibration data for input")
                            for p, s in zip(per_input, inputs)])
        if not samples:
            raise InputError("calibration data is empty")
        return samples
    out = []
    for item in calibration:
        arrays = _by_input(item, inputs)
        for a, s in zip(arrays, inputs):
            if a.size != int(np.prod(s.shape)):
                raise InputError(f"calibration sample for input {s.name!r} has shape {a.shape}; expected {s.shape}")
        out.append([check_array(s.name, np.reshape(a, s.shape), s.shape, "calibration data for input")
                    for a, s in zip(arrays, inputs)])
    if not out:
        raise InputError("calibration data is empty")
    return out


def _by_input(item: Any, inputs: list[InputSpec]) -> list[np.ndarray]:
    if isinstance(item, Mapping):
        return [np.asarray(a) for a in arrays_by_name(item, [s.name for s in inputs], "calibration data")]
    if len(inputs) != 1:
        raise InputError(f"the model has {len(inputs)} inputs {[s.name for s in inputs]}: give calibration samples "
                         "as dicts name -> array")
    return [np.asarray(item)]
