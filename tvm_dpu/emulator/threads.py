"""Sharing one emulator step between threads: a large CONV GEMM is cut into parts, the calling thread computes the
first and pool workers the others (numpy and BLAS release the GIL on large arrays, so the parts run on separate
cores). The parts write disjoint slices of the step's buffers, so no locking is needed; each emulator still
belongs to one calling thread.

A part no worker has started by the time the caller finished its own is taken back and run by the caller: a
busy pool (other emulators, other processes on the cores) never makes a step wait, it only loses the speed-up.
"""
from __future__ import annotations

import contextlib
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Iterator

from tvm_dpu.errors import EmulatorError
from tvm_dpu.util.blas import openblas_thread_setter, openblas_threads  # noqa: F401 (re-exported)

#: Threads sharing a step unless TVM_DPU_EMU_THREADS says otherwise (a number, or "auto": `thread_count`, the
#: cores, at most AUTO_MAX_THREADS, while the load average says the machine is otherwise idle, else 1). 1: on the
#: shared 2-core machine full ResNet-50 ran 0.209 s per image with 1 thread against 0.261 s with 2 and 0.309 s
#: with "auto" (load average 0.9-1.1, one run each, bench_e2e); with a truly idle second core the GEMMs, two
#: thirds of a run, could split over both, which that machine never showed.
DEFAULT_THREADS = 1
AUTO_MAX_THREADS = 2
#: The load average above which the automatic setting keeps to one thread: the emulating process itself counts
#: about 1, so on 2 cores a load under 1.5 means the other core is free.
AUTO_IDLE_MARGIN = 0.5
_LOAD_TTL_S = 1.0
_load_seen = [-1e9, 0.0]  # (monotonic time read, 1-minute load average)


def _env_threads() -> int | None:
    env = os.environ.get("TVM_DPU_EMU_THREADS", "").strip()
    if not env:
        return DEFAULT_THREADS
    if env.lower() == "auto":
        return None
    try:
        n = int(env)
    except ValueError:
        raise EmulatorError(f"TVM_DPU_EMU_THREADS={env!r} is not an integer or \"auto\"") from None
    return max(1, n)


def _load_average() -> float:
    """The 1-minute load average, read at most once per _LOAD_TTL_S (steps ask for it thousands of times a run)."""
    now = time.monotonic()
    if now - _load_seen[0] > _LOAD_TTL_S:
        try:
            _load_seen[1] = os.getloadavg()[0]
        except OSError:  # not available: assume busy, i.e. one thread
            _load_seen[1] = float("inf")
        _load_seen[0] = now
    return _load_seen[1]


def max_threads() -> int:
    """Threads a step's work is cut for (emu_conv._split): TVM_DPU_EMU_THREADS, else the automatic maximum."""
    fixed = _env_threads()
    return fixed if fixed is not None else max(1, min(AUTO_MAX_THREADS, os.cpu_count() or 1))


#: BLAS threads while a program runs (environment TVM_DPU_EMU_BLAS_THREADS; 0 leaves BLAS as configured).
#: CONV GEMMs are narrow (N = OCP = 16 columns): a second thread gains little on an idle 2-core machine and is
#: 3-5x slower when the cores are busy (OpenBLAS threads spin-wait on each other).
DEFAULT_BLAS_THREADS = 1

_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()


def thread_count() -> int:
    """Threads sharing a step now: TVM_DPU_EMU_THREADS when set (1 keeps everything on the calling thread), else
    max_threads() while the load average leaves the other cores free and 1 otherwise."""
    fixed = _env_threads()
    if fixed is not None:
        return fixed
    n = max_threads()
    return n if n > 1 and _load_average() < n - 1 + AUTO_IDLE_MARGIN else 1


def _workers(n: int) -> ThreadPoolExecutor:
    """The process-wide pool, with at least `n` workers."""
    global _pool
    with _pool_lock:
        if _pool is None or _pool._max_workers < n:
            _pool = ThreadPoolExecutor(max_workers=n, thread_name_prefix="tvm-dpu-emu")
        return _pool


def run_parts(parts: list[Callable[[], None]]) -> None:
    """Run every part once: the pool's workers (thread_count() - 1 of them) take parts[1:] from the front, this
    thread runs parts[0] and then, from the back, every part no worker has started yet. With more parts than
    threads, a worker slowed by other load takes fewer of them. The first exception of any part is raised after
    all parts have finished."""
    threads = thread_count() if len(parts) > 1 else 1
    if threads == 1:  # cut for more threads than are to be used now (max_threads): all on this thread
        for part in parts:
            part()
        return
    pool = _workers(threads - 1)
    futures = [pool.submit(p) for p in parts[1:]]
    error: BaseException | None = None
    try:
        parts[0]()
    except BaseException as e:  # still wait for the workers: they write this step's buffers
        error = e
    for part, fut in reversed(list(zip(parts[1:], futures))):
        if fut.cancel() and error is None:
            try:
                part()
            except BaseException as e:
                error = e
    for fut in futures:
        if not fut.cancelled():
            try:
                fut.result()
            except BaseException as e:
                error = error or e
    if error is not None:
        raise error


@contextlib.contextmanager
def blas_threads(n: int | None = None) -> Iterator[None]:
    """Run the body with `n` OpenBLAS threads on this thread (default: TVM_DPU_EMU_BLAS_THREADS or
    DEFAULT_BLAS_THREADS), restoring the previous count after; no effect when n is 0 or OpenBLAS is not found."""
    if n is None:
        env = os.environ.get("TVM_DPU_EMU_BLAS_THREADS", "").strip()
        try:
            n = int(env) if env else DEFAULT_BLAS_THREADS
        except ValueError:
            raise EmulatorError(f"TVM_DPU_EMU_BLAS_THREADS={env!r} is not an integer") from None
    with openblas_threads(n):
        yield
