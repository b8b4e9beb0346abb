"""Running one compiled DPU subgraph from float tensors: quantize, place in DDR, execute, read back, dequantize.

This is the body of every DPU partition call (runtime/dispatch.py): the Relax VM hands float32 inputs and
pre-allocated float32 outputs; the DPU computes in int8 with power-of-two scales.
"""
from __future__ import annotations

import queue
import threading
import weakref
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
            job = self._jobs.get()
            try:
                job()
            except BaseException:  # noqa: BLE001 - the job reports its own failure; the worker lives on
                pass

    def submit(self, job: Any) -> None:
        self._jobs.put(job)


class _WorkerPool:
    """Persistent threads that run segments for `run_segments`: a call takes idle workers (a new one only when
    none is idle) and gives them back, so a model's steady state starts no thread per call (a start costs about
    0.1 ms, as much as a small segment's DPU time), and concurrent calls never share a worker (a worker busy with
    one call's segment cannot hold up another call's)."""

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


_GRAPHS: dict[int, tuple[Any, tuple]] = {}
_GRAPHS_LOCK = threading.Lock()


def _segment_graph(multicore: Multicore) -> tuple[tuple[int, ...], tuple[tuple[int, ...], ...], int]:
    """(how many segments each segment waits for, which segments each one's end frees, threads the schedule's
    cores need) of `multicore`: a segment waits for the segments it reads from and for its core's previous one.
    Worked out once per program (it costs about 3 us per segment, a call's whole dispatch budget otherwise) and
    dropped with it."""
    key = id(multicore)
    with _GRAPHS_LOCK:
        hit = _GRAPHS.get(key)
        if hit is not None and hit[0]() is multicore:
            return hit[1]
    waits = [set(g.after) for g in multicore.segments]
    orders = [o for o in multicore.core_order() if o]
    for order in orders:
        for prev, nxt in zip(order, order[1:]):
            waits[nxt].add(prev)
    frees: list[list[int]] = [[] for _ in waits]
    for i, w in enumerate(waits):
        for d in sorted(w):
            frees[d].append(i)
    graph = (tuple(len(w) for w in waits), tuple(tuple(f) for f in frees), len(orders))
    with _GRAPHS_LOCK:
        _GRAPHS[key] = (weakref.ref(multicore, lambda _, k=key: _GRAPHS.pop(k, None)), graph)
    return graph


class _SegmentRun:
    """One call's segments on its cores, driven by whichever thread frees them. A segment may start once the
    segments it reads from and its core's previous segment (the schedule's order per core) have ended; the thread
    that ends the last of those runs it next, so a join costs no hand-off, and only a fork (one segment freeing
    several) hands the others to idle threads: the calling thread and persistent workers (`WORKERS`), one thread
    per core the schedule uses. At most one segment per core is ready or running, so an idle thread is always
    there for it.

    Why not one thread per core, each waiting for its next segment's producers: every dependency between cores
    was then a sleeping thread's wake-up on the critical path (tens of us each, milliseconds on a loaded host),
    where a driver that polls the cores' done flags needs none."""

    def __init__(self, multicore: Multicore, cores: Sequence[Any], shared: dict):
        self.segments, self.cores, self.shared = multicore.segments, cores, shared
        waits, self.frees, threads = _segment_graph(multicore)
        self.remaining = list(waits)
        self.left = len(self.segments)
        self.failed: list[BaseException] = []
        self.lock = threading.Lock()
        self.mine: queue.SimpleQueue = queue.SimpleQueue()  # the calling thread's segments; None once all ended
        self.workers = WORKERS.take(threads - 1)
        self.idle: list[Any] = [*self.workers, self.mine]

    def run(self) -> None:
        """Run every segment (the calling thread takes part); the first failure is raised here once all ended."""
        try:
            with self.lock:
                ready = [i for i, n in enumerate(self.remaining) if not n]
                self.idle.remove(self.mine)
                for j in ready[1:]:
                    self._hand(j)
            i = ready[0]
            while i is not None:
                self._chain(i, self.mine)
                i = self.mine.get()
        finally:
            WORKERS.give(self.workers)
        if self.failed:
            raise self.failed[0]

    def _hand(self, i: int) -> None:
        """Segment `i` to an idle thread (the lock held)."""
        t = self.idle.pop()
        if t is self.mine:
            t.put(i)
        else:
            t.submit(lambda: self._chain(i, t))

    def _chain(self, i: int | None, me: Any) -> None:
        """Run segment `i`, then one segment it frees (the same core's next if that is one), while any is freed;
        the others go to idle threads. `me`: this thread (the caller's queue or a worker), idle again after."""
        while i is not None:
            seg = self.segments[i]
            try:
                if not self.failed:  # after a failure elsewhere, only release whoever waits on this segment
                    self.cores[seg.core % len(self.cores)].execute(seg.sg, self.shared)
            except BaseException as e:  # noqa: BLE001 - re-raised in the calling thread by run()
                self.failed.append(e)
            with self.lock:
                self.left -= 1
                ready = []
                for j in self.frees[i]:
                    self.remaining[j] -= 1
                    if not self.remaining[j]:
                        ready.append(j)
                ready.sort(key=lambda j: self.segments[j].core != seg.core)
                i = ready[0] if ready else None
                for j in ready[1:]:
                    self._hand(j)
                if i is None:
                    self.idle.append(me)
                    if not self.left:
                        self.mine.put(None)


def run_segments(sg: CompiledSubgraph, multicore: Multicore, cores: Sequence[Any],
                 inputs: list[np.ndarray]) -> list[np.ndarray]:
    """int8 inputs -> int8 outputs of `sg` computed by its segments on `cores` (devices of one DPU; segment core c
    runs on cores[c % len(cores)]), concurrently: each segment starts once the segments it reads from and its
    core's previous segment have ended (`_SegmentRun`: the thread that frees a segment runs it, forks go to
    persistent workers, no thread is started per call; the host's wait for a core's done is the only
    synchronisation the DPUCZDX8G's cores have).

    The segments address one shared feature-map region (REG_SHARED, laid out at compile time by
    codegen/relocate.py), taken for this call from the first core's device: the host writes the partition's
    inputs into it, each segment reads its inputs from and writes its outputs to it in place, the host reads the
    outputs back. Nothing passes between segments through host memory. Segments of a program compiled before
    that layout existed (their own input and output regions) run as the partition's one program on the first
    core instead. The first failure (in any thread) is raised here after every segment has ended."""
    segments = [g.sg for g in multicore.segments]
    if not all(REG_SHARED in s.region_sizes for s in segments):
        return run_int8(sg, cores[0], inputs)
    fmaps = {b.name: b.fmap for s in segments for b in (*s.inputs, *s.outputs)}
    with shared_region(cores[0], segments[0].region_sizes[REG_SHARED]) as region:
        host = np.asarray(region).reshape(-1)
        for b, x in zip(sg.inputs, inputs):
            fmaps[b.name].to_ddr(host, np.asarray(x).reshape(b.shape))
        _sync(region, "flush")
        _SegmentRun(multicore, cores, {REG_SHARED: region}).run()
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
