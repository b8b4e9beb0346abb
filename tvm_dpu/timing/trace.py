"""Timelines of a `TimingResult`: Chrome trace JSON (Perfetto / chrome://tracing) and a PNG Gantt chart.

The Chrome trace has one process ("DPU core") with one thread (track) per engine; every instruction is a complete
event ("ph": "X") from its start to the moment its engine is free, in microseconds at the core clock. Ops of
`op_ranges` are a fifth track. The PNG (matplotlib, Agg backend; a soft dependency) draws the same bars per engine,
like the DNNVM paper's Figures 8-9.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from tvm_dpu.timing.cost import ENGINES
from tvm_dpu.timing.simulate import TimingResult

_COLORS = {"load": "#4C72B0", "save": "#55A868", "conv": "#C44E52", "misc": "#8172B2"}


def chrome_trace(result: TimingResult, max_events: int | None = None) -> dict[str, Any]:
    """The trace as a dict {"traceEvents": [...], "displayTimeUnit": "ns", "otherData": {...}}.

    `max_events` keeps the first instructions only (Perfetto handles ~1e6 events; the default keeps all)."""
    us = 1e6 / result.freq_hz
    ev: list[dict[str, Any]] = [{"ph": "M", "pid": 0, "name": "process_name", "args": {"name": f"DPU {result.arch}"}}]
    for tid, e in enumerate(ENGINES):
        ev.append({"ph": "M", "pid": 0, "tid": tid, "name": "thread_name", "args": {"name": e.upper()}})
    ev.append({"ph": "M", "pid": 0, "tid": len(ENGINES), "name": "thread_name", "args": {"name": "ops"}})
    n = len(result.names) if max_events is None else min(len(result.names), max_events)
    for i in range(n):
        s, e = float(result.start[i]), float(result.end[i])
        ev.append({"ph": "X", "pid": 0, "tid": int(result.engine_of[i]), "name": result.names[i], "ts": s * us,
                   "dur": max(e - s, 0.0) * us, "args": {"instr": i, "done_cycle": float(result.done[i])}})
    for op in result.ops:
        ev.append({"ph": "X", "pid": 0, "tid": len(ENGINES), "name": op.name, "ts": op.start_cycle * us,
                   "dur": op.span * us, "args": {"first_instr": op.first, "end_instr": op.end,
                                                  "cycles": op.cycles, "macs": op.macs}})
    return {"traceEvents": ev, "displayTimeUnit": "ns",
            "otherData": {"arch": result.arch, "freq_mhz": result.freq_hz / 1e6, "cycles": result.cycles,
                          "latency_ms": result.latency_s * 1e3, "gops": result.gops}}


def write_chrome_trace(result: TimingResult, path: str | Path, max_events: int | None = None) -> Path:
    """Write `chrome_trace(result)` as JSON to `path`; returns the path."""
    p = Path(path)
    p.write_text(json.dumps(chrome_trace(result, max_events)))
    return p


def _coalesce(start: np.ndarray, end: np.ndarray, gap: float) -> list[tuple[float, float]]:
    """Intervals [start, end) merged where the next starts less than `gap` after the previous ends."""
    if start.size == 0:
        return []
    order = np.argsort(start, kind="stable")
    s, t = start[order].astype(np.float64), np.maximum.accumulate(end[order].astype(np.float64))
    breaks = np.nonzero(s[1:] - t[:-1] >= gap)[0] + 1
    first = np.concatenate([[0], breaks])
    last = np.concatenate([breaks - 1, [s.size - 1]])
    return list(zip(s[first].tolist(), t[last].tolist()))


def write_gantt_png(result: TimingResult, path: str | Path, title: str | None = None,
                    window: tuple[float, float] | None = None) -> Path | None:
    """Draw a Gantt chart (one row per engine, time in microseconds) to `path`.

    `window` = (first, last) cycle limits the plot to part of the run. Returns the path, or None (with a
    warning naming the missing package) if matplotlib is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        import warnings

        warnings.warn("matplotlib is not installed: PNG Gantt chart skipped (pip install matplotlib)", stacklevel=2)
        return None
    us = 1e6 / result.freq_hz
    lo, hi = window if window is not None else (0.0, result.cycles)
    width_px, dpi = 12, 110
    fig, ax = plt.subplots(figsize=(width_px, 3.2), dpi=dpi)
    # Busy intervals less than a pixel apart are drawn as one bar: the same picture, and a program of tens of
    # thousands of instructions draws in a fraction of the time.
    pixel = max(hi - lo, 1.0) / (width_px * dpi)
    for row, e in enumerate(ENGINES):
        sel = np.nonzero((result.engine_of == row) & (result.end >= lo) & (result.start <= hi))[0]
        bars = [(s * us, max(t - s, 1e-3) * us) for s, t in _coalesce(result.start[sel], result.end[sel], pixel)]
        ax.broken_barh(bars, (len(ENGINES) - 1 - row - 0.4, 0.8), facecolors=_COLORS[e], edgecolor="none")
        util = result.utilisation.get(e, 0.0)
        ax.text(hi * us, len(ENGINES) - 1 - row, f" {100 * util:.0f}% busy", va="center", fontsize=8)
    ax.set_yticks(range(len(ENGINES)))
    ax.set_yticklabels([e.upper() for e in reversed(ENGINES)])
    ax.set_xlim(lo * us, hi * us)
    ax.set_xlabel("time (us)")
    ax.set_title(title or f"{result.arch}: {result.latency_s * 1e3:.3f} ms, {result.gops:.1f} GOPS "
                          f"({100 * result.peak_utilisation:.0f}% of peak)", fontsize=10)
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    p = Path(path)
    fig.savefig(p)
    plt.close(fig)
    return p
