"""Calibration: run the float graph on user data, keep bounded per-tensor statistics, choose fix_points.

`collect_stats` runs the float reference (`xgraph.float_ref`) on every batch and keeps, per feature map, the exact
min / max / count and a seeded uniform reservoir sample of at most `max_samples` values (Vitter's algorithm R,
vectorised per batch), so memory stays bounded however much data is fed and the same data gives the same stats.

`choose_fix_point` picks the radix position fp of a tensor (value = q * 2**-fp, q int8) as DNNVM / Angel-Eye do:
among candidates from the largest fp that does not saturate (the min-max choice) upwards, the fp that minimises
the mean squared error between x and DPURound-and-saturate(x * 2**fp) * 2**-fp over the samples. A finer step
that clips a few outliers usually beats the min-max step on heavy-tailed activations; `method="minmax"` keeps
the min-max choice.

The one-call path (statistics, then the quantizer) is `quantize.calibrate`, exported as `tvm_dpu.quant.calibrate`.
"""
from __future__ import annotations

import math
import zlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from tvm_dpu.errors import QuantizationError
from tvm_dpu.util.progress import progress_bar
from tvm_dpu.quant.fixpoint import INT8_MAX, INT8_MIN
from tvm_dpu.quant.threads import map_threads
from tvm_dpu.xgraph.validate import validate_graph

if TYPE_CHECKING:
    from tvm_dpu.xgraph.graph import Graph

#: Reservoir size per tensor (values kept for the fix_point search).
DEFAULT_MAX_SAMPLES = 1 << 17
#: Candidates examined above the min-max fix_point by the MSE search.
SEARCH_SPAN = 12
#: fix_point given to a tensor that is identically zero (any fix_point represents it exactly).
ZERO_FIX_POINT = 7
METHODS = ("mse", "minmax")


# -- fix_point choice -------------------------------------------------------------------------------------
#: Elements per float64 pass over a large tensor (VGG-16's fc6 holds 103 M weights): the float64 temporaries stay
#: at 32 MiB instead of several copies of the whole tensor. Tensors up to this size are done in one pass.
CHUNK = 1 << 22


def _chunks(x: np.ndarray) -> list[np.ndarray]:
    """`x` (flattened) as float64 pieces of at most CHUNK elements, converted one at a time by the caller."""
    flat = np.asarray(x).reshape(-1)
    return [flat[i:i + CHUNK] for i in range(0, max(flat.size, 1), CHUNK)]


def quantize_values(x: np.ndarray, fp: int) -> np.ndarray:
    """q = DPURound(x * 2**fp) saturated to int8, as int8 (float input)."""
    return _quantize(x, fp, count=False)[0]


def quantize_counting(x: np.ndarray, fp: int) -> tuple[np.ndarray, int]:
    """(quantize_values(x, fp), saturated_count(x, fp)) in one pass over x."""
    return _quantize(x, fp, count=True)


def _quantize(x: np.ndarray, fp: int, count: bool) -> tuple[np.ndarray, int]:
    x = np.asarray(x)
    out = np.empty(x.shape, np.int8)
    flat = out.reshape(-1)
    n = 0
    for i, part in enumerate(_chunks(x)):
        q = np.floor(part.astype(np.float64) * 2.0 ** fp + 0.5)
        if count:
            n += int(np.count_nonzero(q < INT8_MIN)) + int(np.count_nonzero(q > INT8_MAX))
        flat[i * CHUNK:i * CHUNK + part.size] = np.clip(q, INT8_MIN, INT8_MAX, out=q)
    return out, n


def saturated_count(x: np.ndarray, fp: int) -> int:
    """How many values of x DPURound(x * 2**fp) puts outside int8 (they saturate)."""
    return _quantize(x, fp, count=True)[1]


def _mse_per_fp(values: np.ndarray, fps: list[int]) -> list[float]:
    """quant_mse(values, fp) for each fp, one float64 chunk of `values` at a time (a tensor of at most CHUNK
    values in one pass, so its errors are those of the whole-array formula)."""
    flat = np.asarray(values).reshape(-1)
    if flat.size == 0:
        return [0.0] * len(fps)
    sums = [0.0] * len(fps)
    for part in _chunks(flat):
        part = part.astype(np.float64)
        buf = np.empty_like(part)
        for j, fp in enumerate(fps):
            # x - DPURound-and-saturate(x * 2**fp) * 2**-fp, squared, in one reused buffer (the int8 round trip
            # of quantize_values is the identity on these clipped integers).
            np.multiply(part, 2.0 ** fp, out=buf)
            buf += 0.5
            np.floor(buf, out=buf)
            np.clip(buf, INT8_MIN, INT8_MAX, out=buf)
            buf *= 2.0 ** -fp
            np.subtract(part, buf, out=buf)
            np.multiply(buf, buf, out=buf)
            sums[j] += float(np.mean(buf)) if flat.size == part.size else float(np.sum(buf))
    return sums if flat.size <= CHUNK else [v / flat.size for v in sums]


def _clipped_mse(values: np.ndarray, fp: int) -> float:
    """The part of quant_mse(values, fp) that comes from the values that saturate, a lower bound of it: a value v
    with v * 2**fp >= 127.5 becomes 127 (error v - 127 * 2**-fp), one with v * 2**fp <= -128.5 becomes -128, and
    every other value's error is >= 0. It never decreases as fp grows: more values saturate, each by more."""
    flat = np.asarray(values).reshape(-1)
    step = 2.0 ** -fp
    total = 0.0
    for part in _chunks(flat):
        # The thresholds are powers of two times 127.5 and 128.5: a float32 part compares exactly as it is.
        out = part[(part >= 127.5 * step) | (part <= -128.5 * step)].astype(np.float64)
        err = out - np.where(out > 0, INT8_MAX * step, INT8_MIN * step)
        total += float(np.dot(err, err))
    return total / max(flat.size, 1)


#: Relative margin by which the saturation error of a candidate must exceed the best error found to rule it out:
#: far above the float64 rounding of either sum (a few 1e-16 per term), so pruning never changes the choice.
_PRUNE_MARGIN = 1e-9


def _search_mse(values: np.ndarray, fps: list[int]) -> tuple[int, dict[int, float]]:
    """The fp of `fps` (increasing) with the least quant_mse over `values`, ties to the smaller fp, and the
    quant_mse of each fp computed on the way.

    The candidates are computed in order, each with the same arithmetic as quant_mse (the errors compared are
    bit for bit the ones of computing them all); the search stops at the first candidate whose saturation error
    alone (`_clipped_mse`, which only grows with fp) exceeds the best error so far, since neither it nor any
    larger fp can then win. On calibrated ResNet-50 tensors that is after one or two candidates of thirteen.
    """
    errs = {fps[0]: _mse_per_fp(values, [fps[0]])[0]}
    best = fps[0]
    for fp in fps[1:]:
        if _clipped_mse(values, fp) > errs[best] * (1.0 + _PRUNE_MARGIN):
            break
        errs[fp] = _mse_per_fp(values, [fp])[0]
        if errs[fp] < errs[best]:
            best = fp
    return best, errs


def quant_mse(x: np.ndarray, fp: int) -> float:
    """Mean squared error of x against its int8 fixed-point round trip at fix_point fp."""
    return _mse_per_fp(x, [fp])[0]


def minmax_fix_point(vmin: float, vmax: float, default: int = ZERO_FIX_POINT) -> int:
    """Largest fp such that DPURound(v * 2**fp) stays in [-128, 127] for every v in [vmin, vmax]."""
    lo, hi = min(float(vmin), 0.0), max(float(vmax), 0.0)
    if not (math.isfinite(lo) and math.isfinite(hi)):
        raise QuantizationError(f"non-finite value range [{vmin}, {vmax}]")
    if lo == 0.0 and hi == 0.0:
        return default
    amax = max(hi, -lo)
    fp = math.floor(math.log2(INT8_MAX / amax)) + 1  # a first guess, fixed up exactly below

    def ok(f: int) -> bool:
        return math.floor(hi * 2.0 ** f + 0.5) <= INT8_MAX and math.floor(lo * 2.0 ** f + 0.5) >= INT8_MIN

    while not ok(fp):
        fp -= 1
    while ok(fp + 1):
        fp += 1
    return fp


@dataclass(frozen=True)
class FixPointSearch:
    """A fix_point choice and the quant_mse of the values at each fp the search computed (none for "minmax"), so
    that a caller reporting the error at the final fp need not compute it again."""

    fix_point: int
    mse: dict[int, float] = field(default_factory=dict)


def choose_fix_point(values: np.ndarray, method: str = "mse", *, vmin: float | None = None,
                     vmax: float | None = None, span: int = SEARCH_SPAN, default: int = ZERO_FIX_POINT) -> int:
    """fix_point of a tensor from samples of its values.

    method="minmax": the largest fp without saturation over [vmin, vmax] (default: the samples' range; pass the
    exact range when `values` is a subsample). method="mse": the fp in [minmax, minmax + span] minimising
    `quant_mse` over `values` (ties go to the smaller fp, i.e. less clipping). An all-zero tensor gets `default`.
    """
    return search_fix_point(values, method, vmin=vmin, vmax=vmax, span=span, default=default).fix_point


def search_fix_point(values: np.ndarray, method: str = "mse", *, vmin: float | None = None,
                     vmax: float | None = None, span: int = SEARCH_SPAN,
                     default: int = ZERO_FIX_POINT) -> FixPointSearch:
    """`choose_fix_point` with the errors it computed."""
    if method not in METHODS:
        raise QuantizationError(f"unknown fix_point method {method!r} (use one of {', '.join(METHODS)})")
    values = np.asarray(values).ravel()
    if values.dtype.kind not in "fiu":
        values = values.astype(np.float64)
    # min and max propagate NaN and show an infinity (float32 values convert to float64 exactly)
    smin, smax = (float(values.min()), float(values.max())) if values.size else (0.0, 0.0)
    if not (math.isfinite(smin) and math.isfinite(smax)):
        raise QuantizationError("calibration values contain NaN or infinity")
    lo = smin if vmin is None else float(vmin or 0.0)
    hi = smax if vmax is None else float(vmax or 0.0)
    base = minmax_fix_point(lo, hi, default)
    if method == "minmax" or (lo == 0.0 and hi == 0.0) or values.size == 0:
        return FixPointSearch(base)
    return FixPointSearch(*_search_mse(values, list(range(base, base + span + 1))))


def sqnr_db(x: np.ndarray, fp: int, noise: float | None = None) -> float:
    """Signal-to-quantization-noise ratio (dB) of x at fix_point fp; inf when exact. `noise`: quant_mse(x, fp)
    when the caller has it (a `FixPointSearch`)."""
    x = np.asarray(x)
    if noise is None:
        noise = quant_mse(x, fp)
    if x.size <= CHUNK:
        x = x.astype(np.float64)
        signal = float(np.mean(x * x)) if x.size else 0.0
    else:
        signal = sum(float(np.sum(np.square(p.astype(np.float64)))) for p in _chunks(x)) / x.size
    if noise == 0.0:
        return math.inf
    if signal == 0.0:
        return -math.inf
    return 10.0 * math.log10(signal / noise)


# -- statistics -------------------------------------------------------------------------------------------
@dataclass
class TensorStats:
    """Bounded statistics of one tensor: exact min / max / count and a uniform reservoir sample."""

    name: str
    capacity: int
    seed: int
    count: int = 0
    min: float = math.inf
    max: float = -math.inf
    samples: np.ndarray = field(default_factory=lambda: np.zeros(0, np.float32))
    _rng: np.random.Generator | None = field(default=None, repr=False, compare=False)

    def add(self, values: np.ndarray) -> None:
        """Fold a batch of values into the statistics (algorithm R: after n values each one is kept with
        probability capacity / n)."""
        v = np.asarray(values, dtype=np.float32).ravel()
        if v.size == 0:
            return
        # min and max propagate NaN and show an infinity, so they double as the finiteness check.
        vmin, vmax = float(v.min()), float(v.max())
        if not (math.isfinite(vmin) and math.isfinite(vmax)):
            raise QuantizationError(f"tensor {self.name!r}: calibration produced NaN or infinity")
        if self._rng is None:
            self._rng = np.random.default_rng([self.seed, zlib.crc32(self.name.encode())])
        self.min = min(self.min, vmin)
        self.max = max(self.max, vmax)
        room = self.capacity - self.samples.size
        head, rest = v[:max(room, 0)], v[max(room, 0):]
        if head.size:
            self.samples = np.concatenate([self.samples, head])
        # In pieces of CHUNK values: the draws' temporaries (about 24 bytes a value) stay bounded however large
        # the feature map (they were the peak of a large-input compile). The generator's stream is sequential, so
        # the pieces draw exactly the numbers one call would: the same samples, fix points and artifacts.
        for lo in range(0, rest.size, CHUNK):
            part = rest[lo:lo + CHUNK]
            first = self.count + head.size + lo + 1
            # slot = floor(u * seen): the product is >= 0 and the capacity an integer, so floor(x) < capacity
            # exactly when x < capacity, and truncation is the floor: the same slots, with two fewer passes
            x = self._rng.random(part.size)
            x *= np.arange(first, first + part.size, dtype=np.float64)
            keep = np.flatnonzero(x < self.capacity)
            # Fancy assignment writes in order, so a later value wins a slot drawn twice, as in the serial loop.
            self.samples[x[keep].astype(np.int64)] = part[keep]
        self.count += v.size

    @property
    def absmax(self) -> float:
        return max(abs(self.min), abs(self.max)) if self.count else 0.0

    def fix_point(self, method: str = "mse") -> int:
        """fix_point chosen from these statistics (`choose_fix_point` with the exact range)."""
        return self.search(method).fix_point

    def search(self, method: str = "mse") -> FixPointSearch:
        """`fix_point` with the sample errors it computed (`search_fix_point`)."""
        if self.count == 0:
            raise QuantizationError(f"tensor {self.name!r}: no calibration values")
        return search_fix_point(self.samples, method, vmin=self.min, vmax=self.max)


@dataclass
class CalibrationStats:
    """Per-tensor statistics of a float graph over the calibration batches."""

    graph_name: str
    batches: int = 0
    samples: int = 0  # images (batch entries) seen
    tensors: dict[str, TensorStats] = field(default_factory=dict)

    def __contains__(self, name: str) -> bool:
        return name in self.tensors

    def __getitem__(self, name: str) -> TensorStats:
        try:
            return self.tensors[name]
        except KeyError:
            raise QuantizationError(f"no calibration statistics for tensor {name!r} of graph "
                                    f"{self.graph_name!r}") from None

    def fix_point(self, name: str, method: str = "mse") -> int:
        return self[name].fix_point(method)

    def fix_points(self, method: str = "mse") -> dict[str, int]:
        """fix_point of every tensor with statistics, before any DPU constraint is applied."""
        return {n: s.fix_point(method) for n, s in self.tensors.items()}


def _feeds(graph: Graph, batch: Any, index: int) -> dict[str, np.ndarray]:
    if isinstance(batch, Mapping):
        feeds = dict(batch)
    elif len(graph.inputs) == 1:
        feeds = {graph.inputs[0]: batch}
    else:
        raise QuantizationError(f"calibration batch {index}: graph {graph.name!r} has inputs {graph.inputs}; give "
                                "each batch as a dict input name -> array")
    out = {}
    for name, value in feeds.items():
        try:
            arr = np.asarray(value, dtype=np.float64)
        except (TypeError, ValueError) as e:
            raise QuantizationError(f"calibration batch {index}: input {name!r} is not numeric ({e})") from None
        t = graph.tensors.get(name)
        if t is not None and arr.ndim == len(t.shape) - 1:
            arr = arr[None]  # one sample without its batch axis
        out[name] = arr
    return out


class StatsCollector:
    """The statistics of every feature map of a float graph, folded in run by run: `run(batch)` evaluates the
    graph (float64 reference) on one batch, folds its feature maps into the statistics and returns every computed
    tensor, so a caller that needs the graph's outputs anyway (the calibration run of a partitioned model) runs it
    once per sample. `result()` gives the CalibrationStats; `collect_stats` is this over an iterable."""

    def __init__(self, graph: Graph, max_samples: int = DEFAULT_MAX_SAMPLES, seed: int = 0):
        if max_samples < 1:
            raise QuantizationError(f"max_samples must be positive, got {max_samples}")
        validate_graph(graph)
        self.graph = graph
        self.fmaps = list(graph.inputs) + [o for op in graph.ops for o in op.outputs]
        self.stats = CalibrationStats(graph.name, tensors={n: TensorStats(n, max_samples, seed) for n in self.fmaps})

    def run(self, batch: Any) -> dict[str, np.ndarray]:
        from tvm_dpu.errors import DPUError
        from tvm_dpu.xgraph.float_ref import run_graph_float

        i = self.stats.batches
        feeds = _feeds(self.graph, batch, i)
        try:
            env = run_graph_float(self.graph, feeds, keep_all=True)
        except DPUError as e:
            raise QuantizationError(f"calibration batch {i}: {e}") from None
        # Each tensor has its own generator and reservoir, so the folds are independent (numpy releases the GIL
        # in them): the same statistics on every core.
        tensors = self.stats.tensors
        map_threads(lambda name: tensors[name].add(env[name]), self.fmaps)
        self.stats.batches += 1
        self.stats.samples += next(iter(feeds.values())).shape[0]
        return env

    def result(self) -> CalibrationStats:
        if self.stats.batches == 0:
            raise QuantizationError(f"calibration of graph {self.graph.name!r}: the batch iterable is empty; give "
                                    "at least one batch of representative inputs")
        return self.stats


def collect_stats(graph: Graph, batches: Iterable[Any], *, progress: bool = True,
                  max_samples: int = DEFAULT_MAX_SAMPLES, seed: int = 0) -> CalibrationStats:
    """Run the float `graph` on each batch and collect the statistics of every feature map.

    `batches`: an iterable of dicts input name -> float array (N, C, H, W) (or (C, H, W) for one sample), or of
    plain arrays when the graph has a single input. A tqdm progress bar goes to stderr when `progress` and stderr is a terminal.
    Deterministic: the same graph, data, `max_samples` and `seed` give the same statistics.
    Raises QuantizationError on an empty iterable, a malformed batch or non-finite values.
    """
    collector = StatsCollector(graph, max_samples, seed)
    total = len(batches) if hasattr(batches, "__len__") else None  # type: ignore[arg-type]
    bar = progress_bar(batches, progress, total=total, desc=f"calibrating {graph.name}", unit="batch")
    try:
        for batch in bar:
            collector.run(batch)
    finally:
        if hasattr(bar, "close"):
            bar.close()
    return collector.result()
