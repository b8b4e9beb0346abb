"""Calibration data in every form users give it, normalized to batches (one float32 array per model input)."""
from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from tvm_dpu.errors import DPUError, InputError
from tvm_dpu.serving.feeds import arrays_by_name, check_array, input_shape_check, load_npz
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
        per_input = [_as_batches(a, s) for a, s in zip(_by_input(calibration, inputs), inputs)]
    else:
        items = [_by_input(item, inputs) for item in calibration]
        if not items:
            raise InputError("calibration data is empty")
        per_input = []
        for i, s in enumerate(inputs):
            arrays = [np.asarray(item[i]) for item in items]
            if all(a.size == int(np.prod(s.shape)) for a in arrays):
                per_input.append([np.reshape(a, s.shape) for a in arrays])
                continue
            # Samples of a smaller batch than the model's (e.g. batch-1 samples for a batch-4 model): regrouped.
            if not all(a.ndim == len(s.shape) and tuple(a.shape[1:]) == tuple(s.shape[1:]) for a in arrays):
                bad = next(a for a in arrays if a.size != int(np.prod(s.shape)))
                raise InputError(f"calibration sample for input {s.name!r} has shape {bad.shape}; expected "
                                 f"{s.shape} (or samples of a smaller batch, (n, {_rest(s)}))")
            per_input.append(_as_batches(np.concatenate(arrays), s))
    n = min(len(p) for p in per_input)
    samples = [[check_array(s.name, p[i], s.shape, "calibration data for input") for p, s in zip(per_input, inputs)]
               for i in range(n)]
    if not samples:
        raise InputError("calibration data is empty")
    return samples


def _rest(s: InputSpec) -> str:
    return ", ".join(str(d) for d in s.shape[1:])


def _as_batches(a: np.ndarray, s: InputSpec) -> list[np.ndarray]:
    """Batches of input `s` (shape (B, ...)) from `a`: exactly one batch, (N, B, ...) batches, or samples along
    the batch axis, (N, ...) or (N, k, ...): grouped B at a time, the last group filled up by repeating samples
    from the start (so a batch-4 model calibrates on batch-1 samples; a repeated sample adds no new range)."""
    want = tuple(s.shape)
    a = np.asarray(a)
    if tuple(a.shape) == want:
        return [a]
    if tuple(a.shape[1:]) == want:
        return [a[i] for i in range(a.shape[0])]
    if a.ndim == len(want) + 1 and want and tuple(a.shape[2:]) == want[1:]:
        a = a.reshape(-1, *want[1:])  # (N, k, ...) samples of batch k
    if not want or a.ndim != len(want) or tuple(a.shape[1:]) != want[1:] or a.shape[0] == 0:
        raise InputError(f"calibration data for input {s.name!r} has shape {a.shape}; expected {want} or (N, ...) "
                         f"samples of it (samples of a smaller batch too: (N, {_rest(s)}))")
    k = want[0]
    groups = -(-a.shape[0] // k)
    idx = np.arange(groups * k) % a.shape[0]
    return [a[idx[g * k:(g + 1) * k]] for g in range(groups)]


def _by_input(item: Any, inputs: list[InputSpec]) -> list[np.ndarray]:
    if isinstance(item, Mapping):
        return [np.asarray(a) for a in arrays_by_name(item, [s.name for s in inputs], "calibration data")]
    if len(inputs) != 1:
        raise InputError(f"the model has {len(inputs)} inputs {[s.name for s in inputs]}: give calibration samples "
                         "as dicts name -> array")
    return [np.asarray(item)]
