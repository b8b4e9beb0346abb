"""Virtual DPUs on the cores of one device (zcu102: 3 x B4096), next to fGrain's figures (seeds/003: ~25% lower
AlexNet latency from running operators concurrently on virtual FPGAs, < 1.3% virtualisation loss).

1. Branch concurrency, predicted by the timing model: DPU latency of each model built with cores=1, 2, 3
   (`tvm_dpu.build(..., cores=N)`: segments list-scheduled on N cores, DDR bandwidth split among the cores that
   stream at once; segments="auto": segments that gain nothing apart are merged, charging each segment the
   runtime's host cost HOST_DISPATCH_S, and a partition keeps its segments only where they are predicted faster,
   so the gain is >= 0).
   Models: GoogLeNet, ResNet-50, MobileNetV2 and an AlexNet-style two-tower net (the original's two GPU towers).
2. Virtualisation overhead, measured on this host on the finest cut (segments="always", every segment kept,
   the worst case for the runtime): the extra host time of running one partition as segments
   on 3 virtual cores (a thread per core, dependency events; the segments share one feature-map region, so
   nothing is copied between them) over running it as one program on one core, both timed with cores that do no DPU work, in % of
   (a) one run of the whole partition on one emulated core and (b) its predicted DPU latency on the board; and
   "loss (timed)": with cores that sleep each program's predicted DPU time (as a driver waiting on the hardware
   does), how far the segments' wall time exceeds their contention-free schedule, minus how far the one program's
   exceeds its own prediction, in % of the one-program latency (fGrain's "virtualisation loss").
3. Multi-tenant: 3 models on 3 cores at once vs one after another on one core, predicted (timing model, with
   the same DDR contention rule) and measured through `tvm_dpu.serve` with timed cores (each program's
   predicted DPU time slept, the DDR shared by the programs running at once: `tenants_timed`), the host's work
   real; and, secondary, with the emulator (it computes the DPU's work on the host's CPUs, 2 here, so it
   measures the runtime's concurrency, not the DPU's: it cannot show a 3-core gain on this host).

    python benchmarks/bench_vdpu.py                    # reduced models (64x64, channels / 8) -> results/vdpu.json
    python benchmarks/bench_vdpu.py --full             # full-size models (slow)
"""
from __future__ import annotations

import argparse
import ctypes
import os
import statistics
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from results_io import write_results  # noqa: E402  (benchmarks/results_io.py)

DEFAULT_JSON = Path(__file__).resolve().parent / "results" / "vdpu.json"
MODELS = ("googlenet", "resnet50", "mobilenetv2", "alexnet2")
TENANTS = ("googlenet", "resnet50", "mobilenetv2")
FGRAIN_GAIN_PERCENT = 25.0
FGRAIN_OVERHEAD_PERCENT = 1.3


def alexnet_two_towers(reduced: bool, seed: int = 0):
    """AlexNet as Krizhevsky et al. built it for two GPUs: two towers of half the channels each, which exchange
    feature maps only at conv3 and at the classifier. ONNX ModelProto (224x224, or 64x64 and channels / 8)."""
    from tvm_dpu.zoo.graph_builder import GraphBuilder

    res, div, classes = (64, 8, 10) if reduced else (224, 1, 1000)
    b = GraphBuilder(graph_name="alexnet2" + ("_reduced" if reduced else ""), seed=seed)
    x = b.input("input", (1, 3, res, res))

    def conv(t, name, c, k, s=1, p=0):
        return b.relu(b.conv(t, name, max(1, c // div), k, s, p), name + "_relu")

    towers = []
    for i in (0, 1):
        t = b.maxpool(conv(x, f"t{i}.conv1", 48, 11, 4, 2), f"t{i}.pool1", 3, 2)
        towers.append(b.maxpool(conv(t, f"t{i}.conv2", 128, 5, 1, 2), f"t{i}.pool2", 3, 2))
    both = b.concat(towers, "cross3")  # conv3 reads both towers
    outs = []
    for i in (0, 1):
        t = conv(both, f"t{i}.conv3", 192, 3, 1, 1)
        t = conv(t, f"t{i}.conv4", 192, 3, 1, 1)
        outs.append(b.maxpool(conv(t, f"t{i}.conv5", 128, 3, 1, 1), f"t{i}.pool5", 3, 2))
    t = b.flatten(b.concat(outs, "cross6"), "flatten")
    t = b.relu(b.gemm(t, "fc6", max(1, 4096 // div)), "fc6_relu")
    t = b.relu(b.gemm(t, "fc7", max(1, 4096 // div)), "fc7_relu")
    return b.build(b.gemm(t, "fc8", classes))


def model_for(name: str, reduced: bool):
    from tvm_dpu import zoo

    return alexnet_two_towers(reduced) if name == "alexnet2" else zoo.build_model(name, reduced=reduced)


class _NoWork:
    """A core that does no DPU work: running segments on these times only the runtime around them."""

    def __init__(self, arch):
        self.arch = arch

    def execute(self, sg, regions) -> None:
        pass


_THREAD = threading.local()


def _exact_sleeps() -> None:
    """Let this thread's sleeps end on time: Linux's default timer slack (50 us) would add up to that to every
    program a timed core sleeps, an artefact of this stand-in for the DPU that multiplies with the number of
    segments (prctl PR_SET_TIMERSLACK = 1 ns; elsewhere nothing changes)."""
    if getattr(_THREAD, "exact", False):
        return
    _THREAD.exact = True
    try:
        ctypes.CDLL(None, use_errno=True).prctl(29, 1, 0, 0, 0)  # PR_SET_TIMERSLACK
    except (OSError, AttributeError):
        pass


class _Timed:
    """A core that holds the calling thread for the predicted DPU time of each program (time.sleep, as a driver
    waiting on the hardware does, GIL released; timer slack off, `_exact_sleeps`): wall time minus predicted time
    is what the host adds."""

    def __init__(self, arch, seconds: dict[str, float]):
        self.arch = arch
        self.seconds = seconds  # program (subgraph or segment) name -> predicted seconds

    def execute(self, sg, regions) -> None:
        _exact_sleeps()
        time.sleep(self.seconds[sg.name])


class _SharedDDR:
    """The DDR the timed cores of one device share, as the timing model charges it (timing/multicore.py): while k
    programs run at once, each advances at 1/seconds_k of its work per second, and a program starting or ending
    changes k and so the others' rates (the same fluid rule the list scheduler predicts with)."""

    def __init__(self):
        self.cv = threading.Condition()
        self.active = 0
        self.changes = 0

    def hold(self, seconds_by_k: list[float]) -> None:
        """Sleep for one program whose time with k programs running is seconds_by_k[k - 1]."""
        _exact_sleeps()
        with self.cv:
            self._change(+1)
            left = 1.0  # share of the program's work still to do
            while left > 1e-9:
                t = seconds_by_k[min(self.active, len(seconds_by_k)) - 1]
                seen, t0 = self.changes, time.perf_counter()
                self.cv.wait_for(lambda: self.changes != seen, timeout=left * t)
                left -= (time.perf_counter() - t0) / t
            self._change(-1)

    def _change(self, d: int) -> None:
        self.active += d
        self.changes += 1
        self.cv.notify_all()


class _Contended:
    """A timed core whose programs share `ddr` with the device's other cores (`_SharedDDR`)."""

    def __init__(self, arch, seconds_by_k: dict[str, list[float]], ddr: _SharedDDR):
        self.arch, self.seconds_by_k, self.ddr = arch, seconds_by_k, ddr

    def execute(self, sg, regions) -> None:
        self.ddr.hold(self.seconds_by_k[sg.name])


def predicted_ms(model, cores: int) -> float:
    """Predicted DPU latency of `model` built with `cores` (its report's latency on that many cores; a model whose
    partitions all stayed one program runs as on one core)."""
    t = model.report()["timing"]
    return t.get(f"latency_ms_cores_{cores}", t["latency_ms"])


def overhead(model, x, reps: int) -> dict:
    """Runtime cost of running the model's largest segmented partition on 3 virtual cores (no DPU work) vs
    one emulated run of the whole partition, and vs its predicted DPU latency."""
    import numpy as np

    from tvm_dpu.runtime.cores import CoreGroup, VirtualDPU
    from tvm_dpu.runtime.device import EmulatorDevice
    from tvm_dpu.runtime.subgraph_runner import quantize_tensor, run_int8, run_segments
    from tvm_dpu.timing.multicore import list_schedule
    from tvm_dpu.timing.simulate import simulate

    seg = [r for r in model.runners.values() if r.multicore is not None]
    if not seg:
        return {}
    r = max(seg, key=lambda r: r.multicore.single_cycles)
    # any int8 input of the right shape runs the same instructions
    rng = np.random.default_rng(0)
    qin = [quantize_tensor(rng.standard_normal(b.shape), b.fix_point) for b in r.sg.inputs]
    emu = EmulatorDevice(model.arch)
    run_int8(r.sg, emu, qin)  # warm up
    t0 = time.perf_counter()
    run_int8(r.sg, emu, qin)
    single_s = time.perf_counter() - t0
    idle = CoreGroup([VirtualDPU(_NoWork(model.arch), c) for c in range(r.multicore.cores)])

    def host_s(run) -> float:
        run()
        t0 = time.perf_counter()
        for _ in range(reps):
            run()
        return (time.perf_counter() - t0) / reps

    # host work of one call without DPU work: the whole program on one core (its input and output regions) vs its
    # segments on the cores (the shared region, threads, dependency events)
    whole_s = host_s(lambda: run_int8(r.sg, idle.cores[0], qin))
    segments_s = host_s(lambda: run_segments(r.sg, r.multicore, idle.cores, qin))
    extra_s = max(0.0, segments_s - whole_s)
    freq = model.arch.freq_mhz * 1e6
    dpu_s = r.multicore.single_cycles / freq
    # With cores that take each program's predicted time (no DDR contention: every program its one-core time),
    # the loss is what the wall time exceeds the prediction by, segments (vs the contention-free schedule) minus
    # one program (vs its own time), in % of the one-program latency.
    seconds = {g.sg.name: simulate(g.sg.code, model.arch).cycles / freq for g in r.multicore.segments}
    seconds[r.sg.name] = dpu_s
    ideal_s = list_schedule([[seconds[g.sg.name] * freq] for g in r.multicore.segments],
                            [g.after for g in r.multicore.segments], r.multicore.cores, contention=False).makespan / freq
    timed = [VirtualDPU(_Timed(model.arch, seconds), c) for c in range(r.multicore.cores)]
    timed_whole_s = host_s(lambda: run_int8(r.sg, timed[0], qin))
    timed_segments_s = host_s(lambda: run_segments(r.sg, r.multicore, timed, qin))
    loss_s = max(0.0, (timed_segments_s - ideal_s) - (timed_whole_s - dpu_s))
    return {"partition_segments": len(r.multicore.segments), "host_us_one_program": whole_s * 1e6,
            "host_us_segments": segments_s * 1e6, "overhead_us": extra_s * 1e6,
            "emulator_single_core_ms": single_s * 1e3, "predicted_dpu_ms": dpu_s * 1e3,
            "percent_of_emulator_run": 100 * extra_s / single_s, "percent_of_predicted_dpu": 100 * extra_s / dpu_s,
            "timed_cores": {"one_program_ms": timed_whole_s * 1e3, "segments_ms": timed_segments_s * 1e3,
                            "ideal_schedule_ms": ideal_s * 1e3, "loss_us": loss_s * 1e6,
                            "loss_percent": 100 * loss_s / dpu_s}}


def end_to_end(model, x, reps: int) -> dict:
    """Gain and loss measured end to end the way fGrain measures them (the whole `model.run`, VM and host work
    included, the same input each time; median of `reps`, the set-ups taking turns run by run), with cores that
    sleep each program's predicted DPU
    time: a segment its slot in the contention-aware schedule, a whole program its one-core time.

    * native: the whole program on a bare timed device (no virtual-DPU layer);
    * wrapped: the same through one `VirtualDPU` (the runtime layer) - fGrain's virtualisation loss is
      wrapped against native;
    * segments: the partition's segments on a `CoreGroup` of the build's cores - the gain is against native.
    Beside them, the host cost model's prediction of the same runs (tvm_dpu/timing/host.py)."""
    import numpy as np

    from tvm_dpu.runtime.cores import CoreGroup, VirtualDPU
    from tvm_dpu.timing.host import load_host_cost
    from tvm_dpu.timing.simulate import simulate

    freq = model.arch.freq_mhz * 1e6
    seconds: dict[str, float] = {}
    segs = 0
    for r in model.runners.values():
        seconds[r.sg.name] = simulate(r.sg.code, model.arch).cycles / freq
        if r.multicore is not None:
            for g in r.multicore.segments:
                seconds[g.sg.name] = (g.end - g.start) / freq
            segs += len(r.multicore.segments)
    cores = max((r.multicore.cores for r in model.runners.values() if r.multicore is not None), default=1)

    devices = {"native": _Timed(model.arch, seconds), "wrapped": VirtualDPU(_Timed(model.arch, seconds), 0)}
    if segs:
        devices["segments"] = CoreGroup([VirtualDPU(_Timed(model.arch, seconds), c) for c in range(cores)])
    times: dict[str, list[float]] = {k: [] for k in devices}
    for k, d in devices.items():  # warm up each
        model.pin(d)
        model.run(x)
    # the three set-ups take turns, so a load change on this shared host hits them alike; after each switch one
    # untimed run, so a timed run never pays for the switch
    for _ in range(reps):
        for k, d in devices.items():
            model.pin(d)
            model.run(x)
            t0 = time.perf_counter()
            model.run(x)
            times[k].append(time.perf_counter() - t0)
    native, wrapped = statistics.median(times["native"]), statistics.median(times["wrapped"])
    multi = statistics.median(times["segments"]) if segs else wrapped
    host = load_host_cost()
    ins = sum(int(np.prod(s.shape)) for s in model.inputs)
    outs = sum(int(np.prod(s.shape)) for s in model.output_specs())
    dpu_one = sum(simulate(r.sg.code, model.arch).cycles for r in model.runners.values()) / freq
    dpu_multi = sum((r.multicore.cycles if r.multicore is not None else simulate(r.sg.code, model.arch).cycles)
                    for r in model.runners.values()) / freq
    # weights resident on the device: a call pays none; with segments the VM call and conversions as before and
    # each segment its dispatch (its inputs wait in the shared region: no hand-off copies)
    host_one = host.call_seconds(ins, outs, len(model.runners))
    host_multi = host.call_seconds(ins, outs, len(model.runners)) + segs * host.segment_seconds()
    # beside the medians, each set-up's lower quartile: the runs the other processes on a shared host disturbed
    # least (a call of many segments waits for a CPU at every hand-off, the one program once)
    quartile = {k: statistics.quantiles(v, n=4)[0] * 1e3 for k, v in times.items() if len(v) > 1}
    return {"cores": cores, "segments": segs, "native_ms": native * 1e3, "wrapped_ms": wrapped * 1e3,
            "lower_quartile_ms": quartile,
            "segments_ms": multi * 1e3, "gain_percent": 100 * (1 - multi / native),
            # the host's share of each measured call: wall time less the DPU time the cores slept
            "host_ms": {"native": (native - dpu_one) * 1e3, "segments": (multi - dpu_multi) * 1e3},
            "dpu_ms": {"one_program": dpu_one * 1e3, "segments": dpu_multi * 1e3},
            "loss_percent": 100 * (wrapped - native) / native,
            "predicted": {"one_program_ms": (dpu_one + host_one) * 1e3, "segments_ms": (dpu_multi + host_multi) * 1e3,
                          "gain_percent": 100 * (1 - (dpu_multi + host_multi) / (dpu_one + host_one)),
                          "dpu_only_gain_percent": 100 * (1 - dpu_multi / dpu_one) if dpu_one else 0.0}}


def tenants(built: dict, inputs: dict, names: list[str], board: str, runs: int) -> dict:
    """3 models on 3 cores at once vs one after another on one core: predicted and measured."""
    from tvm_dpu.runtime.cores import VirtualDPU, devices, serve
    from tvm_dpu.runtime.device import EmulatorDevice
    from tvm_dpu.timing.multicore import contention_cycles, list_schedule

    cores = devices(board)
    models = [built[n] for n in names]
    k = len(models)
    # predicted: each model's DPU programs (one program per partition) as one unit of work, run one after another
    # on one core, or each on its own core with the DDR shared by however many run at once
    cyc = []
    for m in models:
        per_k = [0.0] * k
        for r in m.runners.values():
            for i, c in enumerate(contention_cycles(r.sg.code, m.arch, k)):
                per_k[i] += c
        cyc.append(per_k)
    ms = 1e3 / (models[0].arch.freq_mhz * 1e6)
    pred_seq = sum(c[0] for c in cyc) * ms
    pred_conc = list_schedule(cyc, [[] for _ in cyc], k).makespan * ms
    pred_ideal = max(c[0] for c in cyc) * ms
    from tvm_dpu.runtime.cores import place_by_load, predicted_load_s

    for m, c in zip(models, place_by_load([predicted_load_s(m) for m in models], len(cores))):
        m.pin(cores[c])
    xs = [inputs[n] for n in names]
    for m, x in zip(models, xs):
        m.run(x)  # link the library, warm the emulator
    conc, _ = serve(models, xs, runs, names)
    single = VirtualDPU(EmulatorDevice(cores[0].arch), 0)
    for m in models:
        m.pin(single)
    t0 = time.perf_counter()
    for m, x in zip(models, xs):
        for _ in range(runs):
            m.run(x)
    seq_s = time.perf_counter() - t0
    return {"models": names, "runs": runs, "predicted_sequential_ms": pred_seq, "predicted_concurrent_ms": pred_conc,
            "predicted_concurrent_no_contention_ms": pred_ideal, "measured_sequential_s": seq_s,
            "measured_concurrent_s": conc.seconds, "per_model": conc.models, "per_core": conc.cores,
            "table": conc.table()}


def tenants_timed(built: dict, inputs: dict, names: list[str], runs: int, reps: int) -> dict:
    """The multi-tenant measurement the issue asks for: `names` served at once, one per core (placed by predicted
    load), vs one after another on one core, with cores that sleep each program's predicted DPU time - alone on
    one core its one-core time, at once with the DDR shared by the programs running at that moment (`_SharedDDR`,
    the timing model's contention rule). `reps` rounds of `runs` runs per model, the two set-ups taking turns;
    medians. The host's work (the VM, quantizing, copies) is real: at once, one tenant's host work overlaps the
    others' DPU time, as on a board."""
    from tvm_dpu.runtime.cores import VirtualDPU, place_by_load, predicted_load_s, serve
    from tvm_dpu.timing.multicore import contention_cycles

    models = [built[n] for n in names]
    k = len(models)
    freq = models[0].arch.freq_mhz * 1e6
    by_k = [{r.sg.name: [c / freq for c in contention_cycles(r.sg.code, m.arch, k)] for r in m.runners.values()}
            for m in models]
    alone = [{n: t[0] for n, t in sec.items()} for sec in by_k]
    place = place_by_load([predicted_load_s(m) for m in models], k)
    ddr = _SharedDDR()
    at_once = [VirtualDPU(_Contended(m.arch, sec, ddr), c) for m, sec, c in zip(models, by_k, place)]
    one_core = [VirtualDPU(_Timed(m.arch, sec), 0) for m, sec in zip(models, alone)]
    xs = [inputs[n] for n in names]
    seq_s, conc_s = [], []

    def in_turn() -> float:
        t0 = time.perf_counter()
        for m, d, x in zip(models, one_core, xs):
            m.pin(d)
            for _ in range(runs):
                m.run(x)
        return time.perf_counter() - t0

    for m, x in zip(models, xs):
        m.run(x)  # link the library
    for _ in range(reps):
        seq_s.append(in_turn())
        for m, d in zip(models, at_once):
            m.pin(d)
        conc_s.append(serve(models, xs, runs, names)[0].seconds)
    seq, conc = statistics.median(seq_s), statistics.median(conc_s)
    return {"models": names, "runs": runs, "reps": reps, "cores": sorted(set(place)),
            "sequential_ms": seq * 1e3, "concurrent_ms": conc * 1e3, "speedup": seq / conc,
            "samples_ms": {"sequential": [t * 1e3 for t in seq_s], "concurrent": [t * 1e3 for t in conc_s]}}


def e2e_only(args) -> int:
    import tvm_dpu
    from tvm_dpu import zoo

    n_cores = tvm_dpu.load_arch(args.board).cores
    out = {}
    for name in args.models.split(","):
        model = model_for(name, not args.full)
        t0 = time.perf_counter()
        built = tvm_dpu.build(model, arch=args.board, progress=False, calibration=[zoo.random_input(model, seed=0)],
                              cores=n_cores)
        e2e = end_to_end(built, zoo.random_input(model, seed=1), args.reps)
        out[name] = {"build_s": time.perf_counter() - t0, "end_to_end": e2e}
        e = out[name]["end_to_end"]
        print(f"{name}: host per call {e['host_ms']['native']:.3f} ms one program, {e['host_ms']['segments']:.3f} ms "
              f"segments (DPU {e['dpu_ms']['one_program']:.3f} / {e['dpu_ms']['segments']:.3f} ms slept)")
        q = e["lower_quartile_ms"]
        if "segments" in q:
            print(f"{name}: lower quartiles native {q['native']:.3f} ms, {n_cores} cores {q['segments']:.3f} ms: "
                  f"gain {100 * (1 - q['segments'] / q['native']):.1f}%")
        print(f"{name}: {e['segments']} segments; native {e['native_ms']:.3f} ms, wrapped {e['wrapped_ms']:.3f} ms, "
              f"{n_cores} cores {e['segments_ms']:.3f} ms: gain {e['gain_percent']:.1f}% (predicted with host "
              f"{e['predicted']['gain_percent']:.1f}%, DPU only {e['predicted']['dpu_only_gain_percent']:.1f}%), "
              f"loss {e['loss_percent']:.2f}%; fGrain: gain ~{FGRAIN_GAIN_PERCENT:.0f}%, loss "
              f"{FGRAIN_OVERHEAD_PERCENT}%", flush=True)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    write_results(args.json, {"board": args.board, "reduced": not args.full, "reps": args.reps,
                                     "fgrain": {"gain_percent": FGRAIN_GAIN_PERCENT,
                                                "overhead_percent": FGRAIN_OVERHEAD_PERCENT},
                                     "models": out, "host_cpus": os.cpu_count()})
    print(f"wrote {args.json}")
    return 0


def _tenant_table(mt: dict, k: int) -> str:
    t = mt["timed"]
    return _table([("", "one core, in turn", f"{k} cores, at once", "gain"),
                   ("predicted DPU ms per round", f"{mt['predicted_sequential_ms']:.3f}",
                    f"{mt['predicted_concurrent_ms']:.3f}",
                    f"{mt['predicted_sequential_ms'] / mt['predicted_concurrent_ms']:.2f}x"),
                   ("measured, timed cores ms (all runs)", f"{t['sequential_ms']:.2f}", f"{t['concurrent_ms']:.2f}",
                    f"{t['speedup']:.2f}x"),
                   ("measured, emulator s (all runs; secondary)", f"{mt['measured_sequential_s']:.2f}",
                    f"{mt['measured_concurrent_s']:.2f}",
                    f"{mt['measured_sequential_s'] / mt['measured_concurrent_s']:.2f}x")])


def _table(rows: list[tuple]) -> str:
    w = [max(len(str(r[i])) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(str(c).ljust(w[i]) if i == 0 else str(c).rjust(w[i]) for i, c in enumerate(r))
                     for r in rows)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--board", default="zcu102")
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--tenants", default=",".join(TENANTS), help="models served at once (one per core)")
    ap.add_argument("--full", action="store_true", help="full-size models (default: reduced)")
    ap.add_argument("--runs", type=int, default=3, help="runs per model in the multi-tenant measurement")
    ap.add_argument("--reps", type=int, default=20, help="repetitions of the overhead measurement")
    ap.add_argument("--tenant-reps", type=int, default=7,
                    help="rounds of the multi-tenant measurement with timed cores (medians)")
    ap.add_argument("--json", type=Path, default=DEFAULT_JSON)
    ap.add_argument("--e2e-only", action="store_true",
                    help="only the end-to-end gain and loss (one build per model on all cores), e.g. with --full "
                    "--models alexnet2,googlenet -> --json results/vdpu_e2e_full.json")
    args = ap.parse_args()

    import tvm_dpu
    from tvm_dpu import zoo

    if args.e2e_only:
        return e2e_only(args)

    names = args.models.split(",")
    tenant_names = args.tenants.split(",")
    n_cores = tvm_dpu.load_arch(args.board).cores
    results, built, inputs = {}, {}, {}
    for name in dict.fromkeys(names + tenant_names):
        model = model_for(name, not args.full)
        cal = [zoo.random_input(model, seed=0)]
        x = zoo.random_input(model, seed=1)
        t0 = time.perf_counter()
        # one build per core count (segments="auto", what a user gets): each schedules for that many cores
        per_cores = {n: tvm_dpu.build(model, arch=args.board, progress=False, calibration=cal, cores=n)
                     for n in range(2, n_cores + 1)}
        first = per_cores[2]
        built[name], inputs[name] = first, x
        if name not in names:
            continue
        # the finest cut on every core, kept regardless: what the runtime's overhead is measured on
        finest = tvm_dpu.build(model, arch=args.board, progress=False, calibration=cal, cores=n_cores,
                               segments="always")
        build_s = time.perf_counter() - t0
        lat = {1: first.timing().latency_s * 1e3}
        lat.update({n: predicted_ms(m, n) for n, m in per_cores.items()})
        segments = {n: sum(len(r.multicore.segments) for r in m.runners.values() if r.multicore is not None)
                    for n, m in per_cores.items()}
        results[name] = {"predicted_latency_ms": {str(k): v for k, v in lat.items()},
                         "predicted_gain_percent": {str(n): 100 * (1 - lat[n] / lat[1]) for n in per_cores},
                         "segments": {str(k): v for k, v in segments.items()}, "build_s": build_s,
                         "decisions": {n: [v["reason"] for v in m.build_info["multicore"].values()]
                                       for n, m in per_cores.items()},
                         "overhead_finest_cut": overhead(finest, x, args.reps),
                         "overhead_auto": overhead(per_cores[n_cores], x, args.reps),
                         "end_to_end": end_to_end(per_cores[n_cores], x, args.reps)}
        print(f"{name}: built in {build_s:.1f} s", file=sys.stderr)
    header = ("model", "1 core ms", *(f"{n} cores ms" for n in range(2, n_cores + 1)),
              *(f"gain {n}c" for n in range(2, n_cores + 1)), *(f"segs {n}c" for n in range(2, n_cores + 1)),
              "overhead us", "% emu run", "% DPU", "loss % (timed)",
              "loss % auto")
    rows = [header]
    for name, r in results.items():
        lat, o = r["predicted_latency_ms"], r["overhead_finest_cut"]
        rows.append((name, f"{lat['1']:.3f}", *(f"{lat[str(n)]:.3f}" for n in range(2, n_cores + 1)),
                     *(f"{r['predicted_gain_percent'][str(n)]:.1f}%" for n in range(2, n_cores + 1)),
                     *(str(r["segments"][str(n)]) for n in range(2, n_cores + 1)),
                     f"{o.get('overhead_us', 0):.0f}", f"{o.get('percent_of_emulator_run', 0):.2f}%",
                     f"{o.get('percent_of_predicted_dpu', 0):.1f}%",
                     f"{o.get('timed_cores', {}).get('loss_percent', 0):.1f}%",
                     f"{r['overhead_auto']['timed_cores']['loss_percent']:.1f}%" if r["overhead_auto"] else "-"))
    print(f"Branch concurrency on {args.board} ({'full size' if args.full else 'reduced models'}), predicted DPU "
          f"latency; fGrain: ~{FGRAIN_GAIN_PERCENT:.0f}% on AlexNet")
    print(_table(rows))
    print(f"segs: segments kept (segments='auto'); overhead and loss measured on the finest cut "
          f"(segments='always'), 'loss % auto' on the segments='auto' build ('-': no segments kept). "
          f"virtualisation overhead: host time of the largest partition's segments on "
          f"{n_cores} cores minus that of "
          "its one program on one core (both without DPU work), in % of one emulated single-core run and of the "
          f"predicted DPU latency; loss (timed): the same with cores that sleep each program's predicted time, wall "
          f"time beyond the prediction, segments minus one program, in % of its latency; fGrain: < "
          f"{FGRAIN_OVERHEAD_PERCENT}%")
    e2e = [("model", "segs", "native ms", "wrapped ms", f"{n_cores} cores ms", "gain", "loss", "pred. gain (host)",
            "pred. gain (DPU only)")]
    for name, r in results.items():
        e = r["end_to_end"]
        e2e.append((name, str(e["segments"]), f"{e['native_ms']:.3f}", f"{e['wrapped_ms']:.3f}",
                    f"{e['segments_ms']:.3f}", f"{e['gain_percent']:.1f}%", f"{e['loss_percent']:.2f}%",
                    f"{e['predicted']['gain_percent']:.1f}%", f"{e['predicted']['dpu_only_gain_percent']:.1f}%"))
    print(f"\nEnd to end, fGrain's way (whole model.run, same input, median of {args.reps}; cores sleep each "
          "program's predicted DPU time): gain = 1 - segments/native; loss = wrapped (one VirtualDPU) / native "
          f"(bare device) - 1. fGrain (measured on its FPGA): gain ~{FGRAIN_GAIN_PERCENT:.0f}% (AlexNet), loss "
          f"{FGRAIN_OVERHEAD_PERCENT}%. What differs: our DPU time is the timing model's, slept, not run; host on "
          "the development machine; fGrain splits AlexNet on virtual FPGA blocks, we split branches on DPU cores.")
    print(_table(e2e))
    mt = tenants(built, inputs, tenant_names, args.board, args.runs)
    mt["timed"] = tenants_timed(built, inputs, tenant_names, args.runs, args.tenant_reps)
    print()
    print(_tenant_table(mt, len(tenant_names)))
    print(mt.pop("table"))
    print(f"(predicted concurrent without DDR contention: {mt['predicted_concurrent_no_contention_ms']:.3f} ms. "
          f"Timed cores: median of {args.tenant_reps} rounds of {args.runs} runs per model, the set-ups taking "
          "turns; at once each program sleeps its time with the DDR shared by the programs running then. Emulator: "
          f"the DPU work computed on this {os.cpu_count()}-core host's CPUs, which 3 emulated cores share: it cannot "
          "show a 3-core gain here, shown as a check of the runtime's concurrency only)")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    write_results(args.json, {
        "board": args.board, "reduced": not args.full, "fgrain": {"gain_percent": FGRAIN_GAIN_PERCENT,
                                                                  "overhead_percent": FGRAIN_OVERHEAD_PERCENT},
        "branch_concurrency": results, "multi_tenant": mt, "host_cpus": os.cpu_count(),
    })
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
