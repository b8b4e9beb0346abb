"""numpy's bundled OpenBLAS, tuned at run time: how many threads the calling thread's products use, and how many
the machine's load leaves worth using. OpenBLAS's threads wait for each other spinning, so on a busy machine a
descheduled partner burns the others' time; each output of a product is reduced the same way on any number of
threads, so the count never changes a result."""
from __future__ import annotations

import contextlib
import ctypes
import functools
import glob
import os
from typing import Callable, Iterator


@functools.lru_cache(maxsize=1)
def openblas_thread_setter() -> Callable[[int], int] | None:
    """`set(n) -> previous n` for numpy's bundled OpenBLAS, or None when it cannot be found."""
    import numpy
    libdir = os.path.dirname(os.path.dirname(numpy.__file__))
    for path in glob.glob(os.path.join(libdir, "numpy.libs", "*openblas*")):
        try:
            lib = ctypes.CDLL(path)  # already loaded by numpy: the same handle
        except OSError:
            continue
        for name in ("openblas_set_num_threads_local", "scipy_openblas_set_num_threads_local64_"):
            fn = getattr(lib, name, None)
            if fn is not None:
                fn.restype, fn.argtypes = ctypes.c_int, [ctypes.c_int]
                return fn
    return None


@contextlib.contextmanager
def openblas_threads(n: int) -> Iterator[None]:
    """Run the body with `n` OpenBLAS threads on this thread, restoring the previous count after; no effect when
    n is 0 or OpenBLAS is not found."""
    setter = openblas_thread_setter() if n > 0 else None
    if setter is None:
        yield
        return
    previous = setter(n)
    try:
        yield
    finally:
        setter(previous)


def free_cores(cores: int | None = None, load: float | None = None) -> int:
    """The cores (default: all of this machine's) less one per whole core the other jobs keep busy (`load`, default:
    the 1-minute load average, read when a process of ours has done little yet), at least 1. Calibration of
    ResNet-50 on 2 cores at load 8-10: 3.0-3.1 CPU-s and 7.7-8.2 s with 2 BLAS threads, 1.7-1.8 CPU-s and 4.3-4.8 s
    with 1; at load 5.5: 3.0 and 2.0-2.3 CPU-s."""
    cores = cores if cores is not None else (os.cpu_count() or 1)
    if load is None:
        try:
            load = os.getloadavg()[0]
        except OSError:  # no load average on this system: every core
            load = 0.0
    return max(1, min(cores, cores - int(load)))
