"""Running one compiled DPU subgraph from float tensors: quantize, place in DDR, execute, read back, dequantize.

This is the body of every DPU partition call (runtime/dispatch.py): the Relax VM hands float32 inputs and
pre-allocated float32 outputs; the DPU computes in int8 with power-of-two scales.
"""
from __future__ import annotations

import queue
import threading
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from tvm_dpu.security.program_blob import Multicore
from tvm_dpu.types import REG_SHARED, CompiledSubgraph
from tvm_dpu.quant.fixpoint import dpu_round, dpu_round_scaled_f32
from tvm_dpu.xgraph.graph import Graph


def quantize_tensor(x: np.ndarray, fix_point: int) -> np.ndarray:
    """float -> int8 with value = q * 2**-fix_point (DPURound, saturate); float32 input without a float64 step."""
    x = np.asarray(x)
    if x.dtype == np.float32:
        return dpu_round_scaled_f32(x, fix_point)
    return dpu_round(np.asarray(x, dtype=np.float64) * (2.0 ** fix_point))


def dequantize_tensor(q: np.ndarray, fix_point: int) -> np.ndarray:
    return np.asarray(q, dtype=np.float32) * np.float32(2.0 ** -fix_point)


@dataclass
class VerifyResult:
    """Golden reference vs device for one call of one subgraph."""

    subgraph: str
    mismatches: int
    elements: int
    first: list[str] = field(default_factory=list)  # e.g. "op 'conv1': 3 of 4096 elements differ"


def run_int8(sg: CompiledSubgraph, device, inputs: list[np.ndarray]) -> list[np.ndarray]:
    """int8 NCHW inputs -> int8 NCHW outputs of `sg`, through fresh input and output regions and `device` (the
    parameters and workspace are the device's: runtime/device.py)."""
    regions = place_int8(sg, inputs)
    device.execute(sg, regions)
    return read_int8(sg, regions)


def place_int8(sg: CompiledSubgraph, inputs: list[np.ndarray]) -> dict:
    """The host's part before a run of `sg`: fresh input and output regions with the int8 NCHW `inputs` placed in
    the DPU's layout (a caller may prepare the next frame this way while the device runs the previous one)."""
    regions = sg.io_regions()
    for b, x in zip(sg.inputs, inputs):
        b.fmap.to_ddr(regions[b.fmap.reg_id], np.asarray(x).reshape(b.shape))
    return regions


def read_int8(sg: CompiledSubgraph, regions: dict) -> list[np.ndarray]:
    """The host's part after a run of `sg`: its int8 NCHW outputs read back from `regions`."""
    return [b.fmap.from_ddr(regions[b.fmap.reg_id]) for b in sg.outputs]


def _batch(sg: CompiledSubgraph, inputs: list[np.ndarray]) -> int:
    """How many images `inputs` hold: a subgraph's program computes one (its bindings' shapes), a batch runs as
    that many calls. ValueError if the inputs disagree or are not whole images."""
    counts = set()
    for b, x in zip(sg.inputs, inputs):
        per_image = int(np.prod(b.shape))
        size = int(np.asarray(x).size)
        if size == 0 or size % per_image:
            raise ValueError(f"DPU subgraph {sg.name!r}: input {b.name!r} has {size} elements, not a whole number "
                             f"of images of shape {list(b.shape)}")
        counts.add(size // per_image)
    if len(counts) != 1:
        raise ValueError(f"DPU subgraph {sg.name!r}: inputs hold different batch sizes {sorted(counts)}")
    return counts.pop()


def shared_region(device: Any, nbytes: int) -> Any:
    """`device.shared_region(nbytes)` (a context manager giving a region all cores of the device address), or for
    a device without one a zeroed host array."""
    make = getattr(device, "shared_region", None)
    return make(nbytes) if make is not None else nullcontext(np.zeros(int(nbytes), np.uint8))


class _Worker:
    """One persistent thread running the closures handed to it, in order."""

    def __init__(self, name: str):
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        threading.Thread(target=self._loop, name=name, daemon=True).start()

    def _loop(self) -> None:
        while True:
            job, finished = self._jobs.get()
            try:
                job()
            except BaseException:  # noqa: BLE001 - the job reports its own failure; the worker lives on
                pass
            finally:
                finished.set()

    def submit(self, job: Any) -> threading.Event:
        finished = threading.Event()
        self._jobs.put((job, finished))
        return finished


class _WorkerPool:
    """Persistent threads that run the other cores' segment orders of `run_segments`: a call takes idle workers
    (a new one only when none is idle) and gives them back, so a model's steady state starts no thread per call
    (a start costs about 0.1 ms, as much as a small segment's DPU time), and concurrent calls never share a worker
    (a worker waiting on one call's segment cannot hold up another call's)."""

    def __init__(self):
        self._idle: list[_Worker] = []
        self._lock = threading.Lock()
        self.started = 0

    def take(self, n: int) -> list[_Worker]:
        with self._lock:
            got = [self._idle.pop() for _ in range(min(n, len(self._idle)))]
            while len(got) < n:
                self.started += 1
                got.append(_Worker(f"tvm-dpu-core-worker-{self.started}"))
            return got

    def give(self, workers: list[_Worker]) -> None:
        with self._lock:
            self._idle.extend(workers)


#: The process's segment workers (threads are per process; the pool only grows to the most cores used at once).
WORKERS = _WorkerPool()


def run_segments(sg: CompiledSubgraph, multicore: Multicore, cores: Sequence[Any],
                 inputs: list[np.ndarray]) -> list[np.ndarray]:
    """int8 inputs -> int8 outputs of `sg` computed by its segments on `cores` (devices of one DPU; segment core c
    runs on cores[c % len(cores)]), concurrently: one thread per core runs that core's segments in schedule
    order (the calling thread and persistent workers, `WORKERS`: no thread is started per call), each segment
    starting once the segments it reads from have ended (the host's wait for a core's done
    is the only synchronisation the DPUCZDX8G's cores have).

    The segments address one shared feature-map region (REG_SHARED, laid out at compile time by
    codegen/relocate.py), taken for this call from the first core's device: the host writes the partition's
    inputs into it, each segment reads its inputs from and writes its outputs to it in place, the host reads the
    outputs back. Nothing passes between segments through host memory. Segments of a program compiled before
    that layout existed (their own input and output regions) run as the partition's one program on the first
    core instead. The first failure (in any thread) is raised here after every thread has stopped."""
    segments = [g.sg for g in multicore.segments]
    if not all(REG_SHARED in s.region_sizes for s in segments):
        return run_int8(sg, cores[0], inputs)
    fmaps = {b.name: b.fmap for s in segments for b in (*s.inputs, *s.outputs)}
    done = [threading.Event() for _ in segments]
    failed: list[BaseException] = []
    lock = threading.Lock()
    with shared_region(cores[0], segments[0].region_sizes[REG_SHARED]) as region:
        host = np.asarray(region).reshape(-1)
        for b, x in zip(sg.inputs, inputs):
            fmaps[b.name].to_ddr(host, np.asarray(x).reshape(b.shape))
        _sync(region, "flush")
        shared = {REG_SHARED: region}

        def work(order: list[int]) -> None:
            for i in order:
                seg = multicore.segments[i]
                for d in seg.after:
                    done[d].wait()
                try:
                    if not failed:  # after a failure elsewhere, only release whoever waits on this segment
                        cores[seg.core % len(cores)].execute(seg.sg, shared)
                except BaseException as e:  # noqa: BLE001 - re-raised in the calling thread below
                    with lock:
                        failed.append(e)
                finally:
                    done[i].set()

        orders = [o for o in multicore.core_order() if o]
        workers = WORKERS.take(len(orders) - 1)
        try:
            finished = [w.submit(lambda o=o: work(o)) for w, o in zip(workers, orders[1:])]
            work(orders[0])  # the calling thread serves the first core
            for f in finished:
                f.wait()
        finally:
            WORKERS.give(workers)
        if failed:
            raise failed[0]
        _sync(region, "invalidate")
        return [fmaps[b.name].from_ddr(host) for b in sg.outputs]


def _sync(region: Any, op: str) -> None:
    """Cache maintenance of a device buffer ("flush" after the host writes, "invalidate" before it reads); host
    memory (the emulator's) needs none."""
    fn = getattr(region, op, None)
    if fn is not None:
        fn()


def execute_float(sg: CompiledSubgraph, device, inputs: list[np.ndarray],
                  output_shapes: list[tuple[int, ...]], multicore: Multicore | None = None
                  ) -> tuple[list[np.ndarray], list[np.ndarray], list[np.ndarray]]:
    """float inputs (any shape with the right element count) -> (int8 inputs, int8 outputs, float outputs in
    `output_shapes`): quantize, run on `device` image by image (the program computes one image; the DPU runs
    batch 1 per core), dequantize. The int8 arrays are N x C x H x W for a batch of N. With `multicore` and a
    device of several cores (`device.cores`, runtime.cores.CoreGroup) each image's segments run concurrently on
    them (`run_segments`)."""
    if len(inputs) != len(sg.inputs):
        raise ValueError(f"DPU subgraph {sg.name!r} takes {len(sg.inputs)} inputs, got {len(inputs)}")
    n = _batch(sg, inputs)
    qin = [quantize_tensor(np.asarray(x).reshape((n, *b.shape[1:])), b.fix_point) for b, x in zip(sg.inputs, inputs)]
    cores = getattr(device, "cores", None)
    if multicore is not None and cores and len(cores) > 1:
        per_image = [run_segments(sg, multicore, cores, [q[i:i + 1] for q in qin]) for i in range(n)]
    else:
        per_image = [run_int8(sg, device, [q[i:i + 1] for q in qin]) for i in range(n)]
    qout = [np.concatenate([outs[k] for outs in per_image]) for k in range(len(sg.outputs))]
    outs = [dequantize_tensor(q, b.fix_point).reshape(s) for q, b, s in zip(qout, sg.outputs, output_shapes)]
    return qin, qout, outs


class SubgraphRunner:
    """One compiled DPU subgraph of a model, as the model sees it: its code (`sg`), the device it runs on, the
    quantized XGraph (`graph`, for golden verification; None when the model carries no verification data) and
    the Relax output shapes. The model's TVM module runs the code; this object verifies and reports."""

    def __init__(self, sg: CompiledSubgraph, device, graph: Graph | None = None,
                 output_shapes: list[tuple[int, ...]] | None = None, program_digest: bytes = b"",
                 multicore: Multicore | None = None):
        self.sg = sg
        #: The segments and their multi-core schedule the program carries (`build(..., cores=N)`), or None.
        self.multicore = multicore
        #: sha256 of the program blob TVM's module embeds for this subgraph (program_blob.digest_of).
        self.program_digest = program_digest
        self.device = device
        self.graph = graph
        self.output_shapes = output_shapes or [b.shape for b in sg.outputs]
        self.verify_results: list[VerifyResult] = []

    def run_float(self, inputs: list[np.ndarray]) -> list[np.ndarray]:
        """Run this subgraph alone on its device: float inputs -> float outputs (Relax output shapes)."""
        return execute_float(self.sg, self.device, inputs, self.output_shapes, self.multicore)[2]

    def check(self, qin: list[np.ndarray], qout: list[np.ndarray]) -> VerifyResult:
        """Golden reference of `graph` on `qin` vs the device's `qout`."""
        from tvm_dpu.xgraph.golden import run_graph

        assert self.graph is not None, "verify needs the quantized XGraph"
        n = int(qin[0].shape[0]) if qin else 1
        golden = [run_graph(self.graph, {b.name: q[i:i + 1] for b, q in zip(self.sg.inputs, qin)}) for i in range(n)]
        bad = 0
        total = 0
        notes = []
        for b, q in zip(self.sg.outputs, qout):
            diff = int(np.sum(np.concatenate([g[b.name] for g in golden]) != q))
            bad += diff
            total += q.size
            if diff:
                notes.append(f"output {b.name!r}: {diff} of {q.size} elements differ")
        return VerifyResult(self.sg.name, bad, total, notes)
