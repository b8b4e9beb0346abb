"""`tvm-dpu benchmark` (xdputil's `benchmark`): throughput and latency of a compiled model through the VART-style
runner, with the time of every DPU subgraph and every CPU part measured, beside the timing model's prediction.

CPU parts are what runs between DPU subgraph calls (and before the first, after the last): TVM's VM code, the
CPU ops, and for an .xmodel its CPU subgraphs. A DPU call's time includes converting its tensors between float
and int8. On the emulator the measured DPU time is the emulator's, not the DPU's: the prediction column is what
the timing model says the DPU itself takes (at the arch's clock).
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tvm_dpu.serving.runner import Runner

#: Latency percentiles reported (xdputil prints the mean; board users ask for the tail).
PERCENTILES = (50, 90, 99)


@dataclass
class PartStats:
    """Measured times (seconds) of one part of the model over the timed runs, and its predicted latency."""

    kind: str  # "dpu" | "cpu"
    name: str
    seconds: list[float] = field(default_factory=list)
    predicted_ms: float | None = None
    note: str = ""

    def to_json(self) -> dict:
        ms = np.asarray(self.seconds) * 1e3
        return {"kind": self.kind, "name": self.name, "calls": len(self.seconds),
                "mean_ms": float(ms.mean()) if ms.size else None,
                **{f"p{p}_ms": float(np.percentile(ms, p)) if ms.size else None for p in PERCENTILES},
                "predicted_ms": self.predicted_ms, **({"note": self.note} if self.note else {})}


@dataclass
class BenchmarkResult:
    threads: int
    runs: int  # per thread
    batch: int
    wall_s: float
    latencies_s: list[float]
    parts: list[PartStats]
    predicted_dpu_ms: float | None
    device: str

    @property
    def jobs(self) -> int:
        return self.threads * self.runs

    def to_json(self) -> dict:
        lat = np.asarray(self.latencies_s) * 1e3
        return {"threads": self.threads, "runs_per_thread": self.runs, "batch": self.batch, "jobs": self.jobs,
                "device": self.device, "wall_s": self.wall_s,
                "throughput_jobs_per_s": self.jobs / self.wall_s,
                "throughput_samples_per_s": self.jobs * self.batch / self.wall_s,
                "latency_ms": {"mean": float(lat.mean()), "min": float(lat.min()), "max": float(lat.max()),
                               **{f"p{p}": float(np.percentile(lat, p)) for p in PERCENTILES}},
                "predicted_dpu_latency_ms": self.predicted_dpu_ms,
                "parts": [p.to_json() for p in self.parts]}

    def table(self) -> str:
        d = self.to_json()
        lat = d["latency_ms"]
        lines = [f"{self.threads} thread(s) x {self.runs} run(s) on the {self.device}, batch {self.batch}: "
                 f"{d['throughput_jobs_per_s']:.2f} runs/s ({d['throughput_samples_per_s']:.2f} samples/s)",
                 f"latency ms: mean {lat['mean']:.3f}, " + ", ".join(f"p{p} {lat[f'p{p}']:.3f}" for p in PERCENTILES)
                 + f", min {lat['min']:.3f}, max {lat['max']:.3f}"]
        rows = [("part", "calls", "mean ms", *(f"p{p} ms" for p in PERCENTILES), "predicted ms")]
        for p in d["parts"]:
            pred = "-" if p["predicted_ms"] is None else f"{p['predicted_ms']:.3f}"
            rows.append((f"{p['kind']} {p['name']}", str(p["calls"]), _ms(p["mean_ms"]),
                         *(_ms(p[f"p{q}_ms"]) for q in PERCENTILES), pred))
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
        lines += ["  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths)))
                  for r in rows]
        lines.insert(3, "  ".join("-" * w for w in widths))
        if self.predicted_dpu_ms is not None:
            lines.append(f"timing model: {self.predicted_dpu_ms:.3f} ms of DPU time per run on the DPU itself "
                         "(CPU parts not modelled)")
        for p in self.parts:
            if p.note:
                lines.append(f"note: {p.kind} {p.name}: {p.note}")
        return "\n".join(lines)


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v:.3f}"


class _Recorder:
    """The runner's profiler: per run, its DPU calls in order, turned into DPU and CPU part times."""

    def __init__(self, dpu_names: dict[str, str]):
        self.dpu_names = dpu_names
        self._local = threading.local()
        self._lock = threading.Lock()
        self.runs: list[tuple[float, float, list[tuple[str, float, float]]]] = []

    def __call__(self, kind: str, name: str, start: float, end: float) -> None:
        calls = self._local.__dict__.setdefault("calls", [])
        if kind == "dpu":
            calls.append((name, start, end))
            return
        self._local.calls = []
        with self._lock:
            self.runs.append((start, end, sorted(calls, key=lambda c: c[1])))

    def parts(self, skip: int) -> list[PartStats]:
        """Part times over the runs after the first `skip` (warm-up) ones."""
        out: dict[tuple[str, str], PartStats] = {}
        for start, end, calls in self.runs[skip:]:
            prev, prev_name = start, "start"
            for name, t0, t1 in calls:
                label = self.dpu_names.get(name, name)
                out.setdefault(("cpu", f"{prev_name}..{label}"), PartStats("cpu", f"{prev_name}..{label}")) \
                    .seconds.append(t0 - prev)
                out.setdefault(("dpu", label), PartStats("dpu", label)).seconds.append(t1 - t0)
                prev, prev_name = t1, label
            out.setdefault(("cpu", f"{prev_name}..end"), PartStats("cpu", f"{prev_name}..end")) \
                .seconds.append(end - prev)
        return list(out.values())


def _dpu_names_and_predictions(model: Any) -> tuple[dict[str, str], dict[str, tuple[float | None, str]]]:
    """(DPU call name -> display name, display name -> (predicted ms, note)) from the timing model."""
    names: dict[str, str] = {}
    predicted: dict[str, tuple[float | None, str]] = {}
    runners = getattr(model, "runners", None)
    if runners is not None:  # a CompiledModel
        timing = model.timing() if runners else None
        for sym in runners:
            sid = model.subgraph_ids.get(sym)
            label = f"sg{sid}" if sid is not None else sym
            names[sym] = label
            predicted[label] = (timing.subgraphs[sym].summary()["latency_ms"], "") if timing else (None, "")
        return names, predicted
    from tvm_dpu.report_html import Timing, subgraph_timing  # an .xmodel: vai_c's programs

    arch = model.arch
    for sub in model.model.dpu_subgraphs():
        names[sub.name] = sub.name
        t = subgraph_timing(np.frombuffer(sub.mc_code, "<u4").astype(np.uint32), arch)
        if isinstance(t, Timing):
            predicted[sub.name] = (t.cycles / (arch.freq_mhz * 1e3), "")
        else:
            predicted[sub.name] = (None, f"no prediction: {t}")
    return names, predicted


def benchmark(model: Any, threads: int = 1, runs: int = 10, warmup: int = 1, inputs: Any = None,
              device: str = "emulator") -> BenchmarkResult:
    """Run `model` (CompiledModel or XModelRunner) `runs` times from each of `threads` threads through a Runner
    with `threads` workers, after `warmup` untimed runs per thread; `inputs` default to random normal (seed 0)."""
    runner = Runner(model, num_threads=threads)
    if inputs is None:
        rng = np.random.default_rng(0)
        inputs = [rng.standard_normal(t.shape).astype(np.float32) for t in runner.get_input_tensors()]
    names, predicted = _dpu_names_and_predictions(model)
    recorder = _Recorder(names)
    runner.profiler = recorder
    latencies: list[float] = []
    lock = threading.Lock()
    barrier = threading.Barrier(threads)
    errors: list[BaseException] = []

    def client() -> None:
        try:
            for _ in range(warmup):
                runner.run(inputs)
            barrier.wait()
            mine = []
            for _ in range(runs):
                t0 = time.perf_counter()
                runner.wait(runner.execute_async(inputs))
                mine.append(time.perf_counter() - t0)
            with lock:
                latencies.extend(mine)
        except BaseException as e:  # noqa: BLE001 - re-raised in the calling thread
            errors.append(e)
            barrier.abort()

    with runner:
        workers = [threading.Thread(target=client, name=f"bench-client-{i}") for i in range(threads)]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
    if errors:  # the failure itself, not the other clients' broken barrier
        raise next((e for e in errors if not isinstance(e, threading.BrokenBarrierError)), errors[0])
    # Every warm-up run starts before the barrier, every timed one after: the first ones by start time are the
    # warm-ups, and the wall clock spans the timed ones.
    recorder.runs.sort(key=lambda r: r[0])
    timed = recorder.runs[warmup * threads:]
    wall = max(r[1] for r in timed) - min(r[0] for r in timed)
    parts = recorder.parts(warmup * threads)
    for p in parts:
        if p.kind == "dpu" and p.name in predicted:
            p.predicted_ms, p.note = predicted[p.name]
    known = [v for v, _ in predicted.values()]
    total = sum(known) if known and all(v is not None for v in known) else None
    batch = runner.get_input_tensors()[0].batch if runner.get_input_tensors() else 1
    return BenchmarkResult(threads, runs, batch, wall, latencies, parts, total, device)


__all__ = ["BenchmarkResult", "PartStats", "benchmark", "PERCENTILES"]
