"""How every benchmark writes its results: only to the path it is told (--json), with the host's load average
beside the timings, so a figure measured on a busy machine says so.

    from results_io import load_average, write_results   # benchmarks/results_io.py

`write_results(path, data)` adds ``host`` = {cpus, load_average_start, load_average_end} (1, 5 and 15 minute
averages from os.getloadavg) to the JSON object, or to every row of a list, and writes it, creating the folder;
nothing else is written (docs blocks are rewritten only by an explicit --write-docs, never as a side effect of a run).
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any


def load_average() -> list[float] | None:
    """The 1, 5 and 15 minute load averages now (None where the OS has none)."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except (AttributeError, OSError):
        return None


def host_record(load_start: list[float] | None) -> dict[str, Any]:
    return {"cpus": os.cpu_count(), "load_average_start": load_start, "load_average_end": load_average()}


def write_results(path: str | Path, data: Any, load_start: list[float] | None = None, indent: int = 2) -> Path:
    """`data` with the host's load averages (at `load_start`, default when the benchmark started, and now), at
    `path` and nowhere else: a JSON object gets a "host" key; a list of rows keeps its shape and every row (a
    JSON object) gets the "host" key."""
    host = host_record(STARTED if load_start is None else load_start)
    if isinstance(data, dict):
        doc: Any = {**data, "host": host}
    else:
        doc = [{**row, "host": host} if isinstance(row, dict) else row for row in data]
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=indent) + "\n")
    return path


#: The load averages when the benchmark started (it imports this module at its top): the default "start".
STARTED = load_average()
