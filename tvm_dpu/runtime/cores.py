"""The cores of one DPU device as separate devices (virtual DPUs, fGrain's idea on the DPUCZDX8G), and several
models served concurrently on them (multi-tenant).

A `VirtualDPU` is one core: it runs one program at a time (a core has one instruction stream), so models that
share a core take turns, and models on different cores run at the same time. It counts what it ran and for how
long, so throughput per model and per core can be reported.
"""
from __future__ import annotations

import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from tvm_dpu.arch import load_arch
from tvm_dpu.arch.arch import Arch
from tvm_dpu.runtime.device import DeviceError
from tvm_dpu.runtime.device_kinds import check_options, device_kind
from tvm_dpu.runtime.subgraph_runner import WORKERS, shared_region
from tvm_dpu.types import CompiledSubgraph


class VirtualDPU:
    """Core `core` of a DPU device: `execute` runs on the wrapped device (an emulator or a Pynq core), one program
    at a time, and accumulates `runs` and `busy_s`."""

    def __init__(self, device: Any, core: int):
        self.device = device
        self.core = core
        self.arch: Arch = device.arch
        self.name = f"{getattr(device, 'name', 'dpu')}:core{core}"
        self.runs = 0
        self.busy_s = 0.0
        self._lock = threading.Lock()

    def execute(self, sg: CompiledSubgraph, regions: dict[int, np.ndarray]) -> None:
        with self._lock:
            t0 = time.perf_counter()
            try:
                self.device.execute(sg, regions)
            finally:
                self.busy_s += time.perf_counter() - t0
                self.runs += 1

    def shared_region(self, nbytes: int) -> Any:
        """A region every core of the wrapped device addresses, for one call's segments (its `shared_region`;
        runtime.subgraph_runner.shared_region)."""
        return shared_region(self.device, nbytes)

    @property
    def last_stats(self):
        return getattr(self.device, "last_stats", None)

    def __repr__(self) -> str:
        return f"VirtualDPU({self.name}, {self.arch.name})"


class CoreGroup:
    """Several virtual DPUs of one device used together by one model: a DPU partition compiled with
    `build(..., cores=N)` runs its segments concurrently on them (runtime.subgraph_runner.run_segments); a
    partition compiled as one program runs on the first. Give it as the model's device."""

    def __init__(self, cores: Sequence[VirtualDPU]):
        cores = list(cores)
        if not cores:
            raise DeviceError("CoreGroup: no cores given")
        fps = {int(c.arch.fingerprint) for c in cores}
        if len(fps) != 1:
            raise DeviceError(f"CoreGroup: cores of different DPUs ({', '.join(hex(f) for f in sorted(fps))})")
        if len({id(c) for c in cores}) != len(cores):
            raise DeviceError("CoreGroup: a core is listed twice")
        self.cores = cores
        self.arch: Arch = cores[0].arch
        self.name = "+".join(c.name for c in cores)

    def execute(self, sg: CompiledSubgraph, regions: dict[int, np.ndarray]) -> None:
        """Run a one-program subgraph on the first core."""
        self.cores[0].execute(sg, regions)

    @property
    def last_stats(self):
        return self.cores[0].last_stats

    def __repr__(self) -> str:
        return f"CoreGroup({self.name}, {self.arch.name})"


def core_group(arch: Any, cores: int, kind: str = "emulator", **options: Any) -> CoreGroup:
    """The first `cores` virtual DPUs of a device of `arch` as one `CoreGroup` (DeviceError when the arch has
    fewer cores)."""
    a = load_arch(arch)
    if isinstance(cores, bool) or not isinstance(cores, int) or not 1 <= cores <= a.cores:
        raise DeviceError(f"cores={cores!r}: {a.name} has {a.cores} DPU core{'s' if a.cores != 1 else ''}; "
                          f"choose between 1 and {a.cores}")
    return CoreGroup(devices(a, kind, **options)[:cores])


def devices(arch: Any, kind: str = "emulator", **options: Any) -> list[VirtualDPU]:
    """One virtual DPU per core of `arch` (a board preset such as "zcu102" has 3). `kind`: "emulator" (an
    independent emulator per core) or "pynq" (`PynqDevice(core=i, **options)`, each core through its own register
    window). Pin a model to a core by giving it one of them as its device (`tvm_dpu.load(path, device=d)`,
    `build(..., device=d)`)."""
    arch = load_arch(arch)
    k = device_kind(kind, f"kind {kind!r}", DeviceError, or_object=False)
    check_options(k, options, f"kind {kind!r}", DeviceError)
    return [VirtualDPU(k.make(arch, i, **options), i) for i in range(arch.cores)]


def place_by_load(loads: Sequence[float], cores: int) -> list[int]:
    """The core of each model given its predicted DPU seconds per run (`loads`): largest first, each onto the
    least-loaded core so far (ties: the lower core), so the busiest core's load is within 4/3 of the best
    placement's (Graham's LPT bound) rather than whatever model i -> core i mod N happens to give."""
    if cores < 1:
        raise DeviceError(f"place_by_load: {cores} cores")
    total = [0.0] * cores
    where = [0] * len(loads)
    for i in sorted(range(len(loads)), key=lambda k: (-float(loads[k]), k)):
        c = min(range(cores), key=lambda j: (total[j], j))
        where[i] = c
        total[c] += float(loads[i])
    return where


def predicted_load_s(model: Any) -> float:
    """A model's predicted DPU seconds per run on one core (every DPU partition as one program: a tenant's
    partitions run on the one core it is pinned to)."""
    return float(model.timing().latency_s)


@dataclass
class TenantReport:
    """What `serve` measured: per model its runs and throughput, per core its runs and busy share."""

    seconds: float
    models: list[dict] = field(default_factory=list)
    cores: list[dict] = field(default_factory=list)

    def table(self) -> str:
        lines = [f"{'model':<12} {'core':>4} {'runs':>5} {'runs/s':>8}"]
        lines += [f"{m['name']:<12} {m['core']:>4} {m['runs']:>5} {m['runs_per_s']:>8.2f}" for m in self.models]
        per_s = [c["runs"] / self.seconds if self.seconds else 0.0 for c in self.cores]
        lines += [f"core {c['core']}: {c['runs']} DPU programs ({r:.2f}/s), "
                  f"busy {100 * c['busy_share']:.0f}% of {self.seconds:.2f} s" for c, r in zip(self.cores, per_s)]
        return "\n".join(lines)


def serve(models: Sequence[Any], inputs: Sequence[Any], runs: int, names: Sequence[str] | None = None
          ) -> tuple[TenantReport, list[list[np.ndarray]]]:
    """Run each of `models` (CompiledModels, each pinned to a VirtualDPU through its `device`) `runs` times on its
    input, all models at once, each from its own persistent worker thread (`subgraph_runner.WORKERS`). The first
    failure of any model is raised here once every model has stopped. Returns the report and each model's last
    outputs."""
    names = list(names or [f"model{i}" for i in range(len(models))])
    cores = {id(m.device): m.device for m in models}
    for d in cores.values():
        if not isinstance(d, VirtualDPU):
            raise DeviceError(f"serve: give each model a device from tvm_dpu.devices(...), not {d!r}")
    base = {k: (d.runs, d.busy_s) for k, d in cores.items()}

    results: list[Any] = [None] * len(models)
    ended = queue.SimpleQueue()

    def loop(i: int) -> None:
        try:
            t0 = time.perf_counter()
            out = None
            for _ in range(runs):
                out = models[i].run(inputs[i])
            results[i] = (time.perf_counter() - t0, out)
        except BaseException as e:  # noqa: BLE001 - re-raised in the caller below
            results[i] = e
        finally:
            ended.put(i)

    # the tenants' loops run on the segment runtime's persistent workers (no thread started per serve call)
    workers = WORKERS.take(len(models))
    t0 = time.perf_counter()
    try:
        for i, w in enumerate(workers):
            w.submit(lambda i=i: loop(i))
        for _ in models:
            ended.get()
    finally:
        WORKERS.give(workers)
    total = time.perf_counter() - t0
    for r in results:
        if isinstance(r, BaseException):
            raise r
    report = TenantReport(total)
    for name, m, (secs, _) in zip(names, models, results):
        report.models.append({"name": name, "core": m.device.core, "runs": runs, "seconds": secs,
                              "runs_per_s": runs / secs if secs > 0 else float("inf")})
    for k, d in sorted(cores.items(), key=lambda kv: kv[1].core):
        runs0, busy0 = base[k]
        report.cores.append({"core": d.core, "runs": d.runs - runs0, "busy_s": d.busy_s - busy0,
                             "busy_share": (d.busy_s - busy0) / total if total > 0 else 0.0})
    return report, [r[1] for r in results]
