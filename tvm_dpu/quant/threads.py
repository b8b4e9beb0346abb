"""`map_threads`: the quantizer's independent numpy reductions (fix_point searches, constant quantization) run on
every core. numpy releases the GIL inside its loops, so threads scale on them; the results are the same as a
sequential map (each call is a pure function of its item), in the items' order."""
from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

T = TypeVar("T")
R = TypeVar("R")


def map_threads(fn: Callable[[T], R], items: Iterable[T]) -> list[R]:
    """[fn(x) for x in items], computed on up to os.cpu_count() threads; the first exception (in item order) is
    raised as the sequential map would raise it."""
    items = list(items)
    workers = min(os.cpu_count() or 1, len(items))
    if workers <= 1:
        return [fn(x) for x in items]
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="tvm-dpu-quant") as pool:
        return list(pool.map(fn, items))
