"""A runner shaped like VART's (`vart.Runner`): what board code written for Vitis AI expects.

    runner = tvm_dpu.create_runner("m.tvmdpu")            # or an .xmodel, a CompiledModel, an XModelRunner
    x, = runner.get_input_tensors()                      # TensorInfo: name, shape, dtype, fix_point
    job = runner.execute_async([img_int8], [out_int8])  # buffers filled in place; int8 or float32
    runner.wait(job)                                     # 0 when done (the job's error is raised)

Buffers: one per input / output tensor, in the order `get_*_tensors()` gives (or a dict by name). An int8
buffer holds q with x = q * 2**-fix_point (the tensor's `fix_point`; a tensor without one has no int8 view);
a float buffer (or an input of another integer type, e.g. uint8 pixels) holds x itself. Batch, as VART does: a tensor's shape carries the batch the model was compiled for
(B); a buffer may hold any number n of samples in its leading axis: n < B runs one padded batch, n > B runs
ceil(n / B) batches, and the outputs hold the same n samples. So a batch-4 model takes batch-1 samples.

Thread-safe: jobs run on a pool of `num_threads` worker threads (each with its own TVM VM); several threads
may submit and wait at once.
"""
from __future__ import annotations

import itertools
import os
import threading
from concurrent import futures
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from tvm_dpu.errors import DPUError, InputError
from tvm_dpu.serving.feeds import arrays_by_name


@dataclass(frozen=True)
class TensorInfo:
    """A model input or output as VART's `xir.Tensor` describes it."""

    name: str
    shape: tuple[int, ...]  # the compiled batch first
    dtype: str  # what the model computes in ("float32"; an .xmodel output without fix2float: "int8")
    fix_point: int | None  # int8 view: x = q * 2**-fix_point; None: float only (a tensor the CPU side owns)

    @property
    def batch(self) -> int:
        return int(self.shape[0]) if self.shape else 1

    def to_json(self) -> dict:
        return {"name": self.name, "shape": list(self.shape), "dtype": self.dtype, "fix_point": self.fix_point}


@dataclass
class Job:
    """A submitted execution: `id`, the output buffers it fills, and its future (`Runner.wait` waits on it)."""

    id: int
    outputs: list[np.ndarray]
    future: Future = field(repr=False)


#: timer(kind "dpu" | "run", name, start, end): one record per DPU subgraph call and per whole run.
Profiler = Callable[[str, str, float, float], None]


class Runner:
    """Runs a compiled model (CompiledModel or XModelRunner) the VART way; see the module docstring."""

    def __init__(self, model: Any, num_threads: int = 1):
        if not _is_int(num_threads) or not 1 <= num_threads <= MAX_THREADS:
            raise DPUError(f"num_threads={num_threads!r}: a whole number of worker threads from 1 to {MAX_THREADS}")
        self._closed = False
        self.model = model
        fps = model.tensor_fix_points()
        self._inputs = [TensorInfo(s.name, tuple(int(d) for d in s.shape), str(s.dtype), fps.get(s.name))
                        for s in model.inputs]
        self._outputs = [TensorInfo(s.name, tuple(int(d) for d in s.shape), str(s.dtype), fps.get(s.name))
                         for s in model.output_specs()]
        self._pool = ThreadPoolExecutor(max_workers=num_threads, thread_name_prefix="tvm-dpu-runner")
        self._ids = itertools.count(1)
        self._jobs: dict[int, Job] = {}
        self._lock = threading.Lock()
        self.profiler: Profiler | None = None

    # -- VART's interface -------------------------------------------------------------------------------------
    def get_input_tensors(self) -> list[TensorInfo]:
        return list(self._inputs)

    def get_output_tensors(self) -> list[TensorInfo]:
        return list(self._outputs)

    def execute_async(self, inputs: Any, outputs: Any = None) -> Job:
        """Submit one execution. `inputs`: buffers in input order (a list, a dict by name, or one array);
        `outputs`: buffers to fill in output order (or a dict), None to have float32 ones allocated. Buffers are
        checked now (InputError naming the tensor); the run happens on a worker thread."""
        if self._closed:
            raise DPUError("execute_async on a closed runner: create a new one (tvm_dpu.create_runner)")
        feeds, n = self._feeds(inputs)
        outs = self._output_buffers(outputs, n)
        job_id = next(self._ids)
        future = self._pool.submit(self._execute, feeds, n, outs)
        job = Job(job_id, outs, future)
        with self._lock:
            self._jobs[job_id] = job
        return job

    def wait(self, job: Job | int, timeout: float | None = None) -> int:
        """Wait for `job` (a Job or its id); 0 once its outputs are filled. The job's error, if it failed, is
        raised here; a job is waited for once."""
        if not isinstance(job, Job) and not _is_int(job):
            raise DPUError(f"wait({job!r}): expected a Job from execute_async or its id (an int)")
        if timeout is not None and (not isinstance(timeout, (int, float)) or isinstance(timeout, bool)
                                    or not 0 <= timeout < float("inf")):
            raise DPUError(f"wait(timeout={timeout!r}): expected None (no limit) or seconds >= 0")
        job_id = job.id if isinstance(job, Job) else int(job)
        with self._lock:
            found = self._jobs.get(job_id)
        if found is None:
            raise DPUError(f"job {job_id} is not pending on this runner (already waited for, or never submitted)")
        try:
            found.future.result(timeout)  # a timeout leaves the job pending: it can be waited for again
        except futures.TimeoutError:  # the builtin TimeoutError from 3.11 on, its own class on 3.10
            raise
        except BaseException:
            self._forget(job_id)
            raise
        self._forget(job_id)
        return 0

    def _forget(self, job_id: int) -> None:
        with self._lock:
            self._jobs.pop(job_id, None)

    def run(self, inputs: Any, outputs: Any = None) -> list[np.ndarray]:
        """execute_async + wait: the filled output buffers."""
        job = self.execute_async(inputs, outputs)
        self.wait(job)
        return job.outputs

    def close(self) -> None:
        self._closed = True
        self._pool.shutdown(wait=True)

    def __enter__(self) -> Runner:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # -- buffers --------------------------------------------------------------------------------------------
    def _feeds(self, inputs: Any) -> tuple[list[np.ndarray], int]:
        """Float input arrays (int8 buffers dequantized) and the number of samples they hold."""
        arrays = arrays_by_name(inputs, [t.name for t in self._inputs], "runner inputs")
        feeds, counts = [], set()
        for t, a in zip(self._inputs, arrays):
            a = np.asarray(a)
            counts.add(_samples(t, a.shape, "input"))
            feeds.append(_to_float(t, a))
        if len(counts) > 1:
            raise InputError(f"runner inputs hold different numbers of samples {sorted(counts)}: give every input "
                             "the same leading (batch) size")
        return feeds, counts.pop()

    def _output_buffers(self, outputs: Any, n: int) -> list[np.ndarray]:
        if outputs is None:
            return [np.zeros((n, *t.shape[1:]) if t.shape else (), np.int8 if t.dtype == "int8" else np.float32)
                    for t in self._outputs]
        bufs = [np.asarray(b) for b in arrays_by_name(outputs, [t.name for t in self._outputs], "runner outputs")]
        for t, b in zip(self._outputs, bufs):
            if _samples(t, b.shape, "output") != n:
                raise InputError(f"output buffer {t.name!r} has shape {b.shape} for {n} input sample(s); expected "
                                 f"{(n, *t.shape[1:])}")
            if not b.flags.writeable:
                raise InputError(f"output buffer {t.name!r} is read-only")
            _check_int8(t, b.dtype, "output")
            if b.dtype not in (np.int8, np.float32):
                raise InputError(f"output buffer {t.name!r} is {b.dtype}: outputs are written as float32, or as int8 "
                                 "with the tensor's fix_point")
        return bufs

    # -- execution ------------------------------------------------------------------------------------------
    def _execute(self, feeds: list[np.ndarray], n: int, outs: list[np.ndarray]) -> None:
        batch = self._inputs[0].batch
        for start in range(0, n, batch):
            stop = min(start + batch, n)
            chunk = [_padded(a[start:stop], t.batch) for a, t in zip(feeds, self._inputs)]
            results = self._run_once(chunk)
            for t, buf, y in zip(self._outputs, outs, results):
                y = np.asarray(y)
                if n == t.batch and tuple(y.shape) == tuple(buf.shape):
                    buf[...] = _from_value(t, y, buf.dtype)
                else:
                    buf[start:stop] = _from_value(t, y[:stop - start], buf.dtype)

    def _run_once(self, feeds: list[np.ndarray]) -> list[np.ndarray]:
        prof = self.profiler
        if prof is None:
            return self.model.run(feeds)
        import time

        start = time.perf_counter()
        out = self.model.run(feeds, timer=lambda name, t0, t1: prof("dpu", name, t0, t1))
        prof("run", "", start, time.perf_counter())
        return out


#: The most worker threads a runner starts (each holds a TVM VM; far past the cores of any board).
MAX_THREADS = 256


def _is_int(v: Any) -> bool:
    return isinstance(v, (int, np.integer)) and not isinstance(v, bool)


def _samples(t: TensorInfo, shape: tuple[int, ...], kind: str) -> int:
    """How many samples a buffer of `shape` holds for tensor `t` (InputError if its shape does not fit)."""
    if not t.shape:
        if tuple(shape) != ():
            raise InputError(f"{kind} {t.name!r} is a scalar; got a buffer of shape {tuple(shape)}")
        return 1
    if len(shape) != len(t.shape) or tuple(shape[1:]) != tuple(t.shape[1:]) or shape[0] < 1:
        raise InputError(f"{kind} {t.name!r} has shape {t.shape} (batch {t.batch}); got a buffer of shape "
                         f"{tuple(shape)}: expected (n, {', '.join(str(d) for d in t.shape[1:])}) with n >= 1")
    return int(shape[0])


def _check_int8(t: TensorInfo, dtype: np.dtype, kind: str) -> None:
    if dtype == np.int8 and t.fix_point is None and t.dtype != "int8":
        raise InputError(f"{kind} {t.name!r} has no fix_point (no DPU subgraph reads or writes it directly: a CPU "
                         "op is in between), so it has no int8 view: use a float32 buffer")
    if dtype.kind not in "fiu":
        raise InputError(f"{kind} {t.name!r}: buffer dtype {dtype} (expected int8 (quantized) or float32; other "
                         "integer types hold plain values)")


def _to_float(t: TensorInfo, a: np.ndarray) -> np.ndarray:
    _check_int8(t, a.dtype, "input")
    if a.dtype == np.int8:
        return a.astype(np.float32) * np.float32(2.0 ** -t.fix_point)
    return a


def _from_value(t: TensorInfo, y: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """The model's value `y` of tensor `t` as a buffer of `dtype` (int8 <-> float through the fix_point)."""
    is_q = y.dtype == np.int8
    if dtype == np.int8:
        if is_q:
            return y
        return np.clip(np.rint(y.astype(np.float64) * 2.0 ** t.fix_point), -128, 127).astype(np.int8)
    if is_q:
        if t.fix_point is None:
            raise DPUError(f"output {t.name!r} is int8 without a fix_point: read it into an int8 buffer")
        return y.astype(np.float32) * np.float32(2.0 ** -t.fix_point)
    return y


def _padded(a: np.ndarray, batch: int) -> np.ndarray:
    """`a` (1..batch samples) filled up to `batch` with zero samples (they are computed and dropped)."""
    if a.shape[0] == batch:
        return a
    return np.concatenate([a, np.zeros((batch - a.shape[0], *a.shape[1:]), a.dtype)])


def create_runner(model: Any, num_threads: int = 1, **load_options: Any) -> Runner:
    """A `Runner` for `model`: a CompiledModel or XModelRunner, or a path to a .tvmdpu artifact or vai_c .xmodel
    (loaded with `tvm_dpu.load(path, **load_options)`: device=, trust options, ...)."""
    if isinstance(model, (str, os.PathLike)):
        from tvm_dpu import load

        model = load(model, **load_options)
    elif load_options:
        raise DPUError(f"create_runner: {sorted(load_options)} apply to loading a file; the model is loaded")
    if not callable(getattr(model, "tensor_fix_points", None)) or not callable(getattr(model, "run", None)):
        raise DPUError(f"create_runner: {type(model).__name__} is not a compiled model (give a CompiledModel, an "
                       "XModelRunner or the path of a .tvmdpu / .xmodel file)")
    return Runner(model, num_threads)


__all__ = ["Job", "Runner", "TensorInfo", "create_runner"]
