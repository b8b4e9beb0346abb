"""Multi-board pipelines (the PYNQ-cluster paper, shared/seeds/002): ResNet-50 split over 1..N boards.

Predicted (timing model + link model, `tvm_dpu.pipeline.plan`): for each board preset and link, the optimal
op-granularity plan on 1..N boards: frames/s, GOPS (the model's 2 x MACs / bottleneck stage), speedup over one
board, scaling efficiency (speedup / boards), the bottleneck stage and what bounds it, and how busy the busiest
link is (its transfer time / the bottleneck period). The paper's own figures are printed beside it: 75.1 FPS /
292 GOPS on 4 boards, 380 GOPS on 5, linear from 2 to 5 boards, saturating at 6 (cuts only between residual
blocks; its boards are HLS accelerators at 100 MHz, not DPUs, so compare the shape, not the absolute numbers).
For one plan (4 boards, first preset, first link) every stage is compiled for real and its program simulated,
to compare with the planner's per-op estimate.

Measured (this machine, emulated stages of the reduced model): the executors' own cost per frame, i.e. the wall
time of a frame through `run_stream(max_in_flight=1)` minus the stages' own `run` time for it, for the local
executor (threads + queues) and the Ray executor (actors on a real local Ray cluster; skipped if Ray is absent).

    python benchmarks/bench_pipeline.py                  # full-size ResNet-50 -> results/pipeline.json
    python benchmarks/bench_pipeline.py --quick          # reduced ResNet-50: checks the script (~1 min)
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from results_io import write_results  # noqa: E402  (benchmarks/results_io.py)

DEFAULT_JSON = Path(__file__).resolve().parent / "results" / "pipeline.json"
PAPER = {"fps": {4: 75.1}, "gops": {4: 292.0, 5: 380.0}, "shape": "linear from 2 to 5 boards, saturating at 6"}


def limit_of(plan, ops, n_boards: int) -> str:
    """What bounds the plan's bottleneck: the largest single op, the link, or the op granularity."""
    worst = max(plan.stages, key=lambda s: s.seconds)
    arch = worst.board.arch
    largest = max(ops, key=lambda o: o.seconds[arch])
    if worst.send_s >= worst.busy_s or (not plan.link.overlap and worst.send_s > 0.5 * worst.seconds):
        return f"link ({worst.send_bytes} B per frame out of stage {plan.stages.index(worst)})"
    if worst.bound == "host":
        return (f"host ({worst.host_s * 1e3:.3f} ms against DPU {worst.compute_s * 1e3:.3f} ms in stage "
                f"{plan.stages.index(worst)})")
    if largest.seconds[arch] >= 0.9 * worst.compute_s:
        return f"largest op {largest.name} ({largest.seconds[arch] * 1e3:.3f} ms)"
    ideal = sum(o.seconds[arch] for o in ops) / n_boards
    return (f"op granularity (ideal {ideal * 1e3:.3f} ms/stage, largest op {largest.name} "
            f"{largest.seconds[arch] * 1e3:.3f} ms)")


def predict(model, arch: str, links: list[str], max_boards: int, macs: int, host_scale: float = 1.0) -> list[dict]:
    """Per link and board count: the plan with the measured host cost model, stages double-buffered as a board
    runs them (the row's headline: end to end), the same with the host strictly serial with the DPU
    ("serial_host_*"), and on DPU + link time only ("dpu_only_*", what the figures counted before).
    `host_scale`: the host costs times this (1: as measured on this machine)."""
    from tvm_dpu.pipeline.model import boards_for
    from tvm_dpu.pipeline.plan import load_link, op_chain, plan_chain
    from tvm_dpu.pipeline.stages import host_terms
    from tvm_dpu.timing.host import load_host_cost

    ops = op_chain(model, boards_for(arch, 1))
    cost = load_host_cost().scaled(host_scale)
    host = host_terms(model, cost)
    serial = host_terms(model, cost, overlap=False)
    rows = []
    for link_name in links:
        link = load_link(link_name)
        base = base_dpu = base_serial = None
        for n in range(1, max_boards + 1):
            if n > len(ops):
                break
            bare = plan_chain(ops, boards_for(arch, n), link)
            plan = plan_chain(ops, boards_for(arch, n), link, host)
            strict = plan_chain(ops, boards_for(arch, n), link, serial)
            fps = plan.fps
            base = base or fps
            base_dpu = base_dpu or bare.fps
            base_serial = base_serial or strict.fps
            busiest = max(plan.stages, key=lambda s: s.send_s)
            worst = max(range(n), key=lambda i: plan.stages[i].seconds)
            rows.append({"arch": arch, "link": link_name, "boards": n, "fps": fps,
                         "gops_1op_per_mac": macs * fps / 1e9, "gops": 2 * macs * fps / 1e9,
                         "speedup": fps / base, "efficiency": fps / base / n, "bottleneck": plan.bottleneck(),
                         "host_ms": [round(s.host_s * 1e3, 4) for s in plan.stages],
                         "dpu_only_fps": bare.fps, "dpu_only_efficiency": bare.fps / base_dpu / n,
                         "dpu_only_gops_1op_per_mac": macs * bare.fps / 1e9,
                         "serial_host_fps": strict.fps, "serial_host_efficiency": strict.fps / base_serial / n,
                         "serial_host_bottleneck": strict.bottleneck(), "host_scale": host_scale,
                         "bottleneck_stage": worst,
                         "bottleneck_ms": plan.bottleneck_s * 1e3, "latency_ms": plan.latency_s * 1e3,
                         "largest_op_ms": max(o.seconds[arch] for o in ops) * 1e3,
                         "link_utilisation": busiest.send_s / plan.bottleneck_s,
                         "max_send_bytes": max(s.send_bytes for s in plan.stages),
                         "limit": limit_of(plan, ops, n) if n > 1 else "-",
                         "stage_ms": [round(s.seconds * 1e3, 4) for s in plan.stages]})
    return rows


def stage_check(model, arch: str, link: str, n: int) -> list[dict]:
    """Compile the n-board plan's stages and simulate each stage's own program."""
    from tvm_dpu.pipeline.model import boards_for
    from tvm_dpu.pipeline.plan import load_link, op_chain, plan_chain
    from tvm_dpu.pipeline.stages import compile_stages

    boards = boards_for(arch, n)
    plan = plan_chain(op_chain(model, boards), boards, load_link(link))
    out = []
    for (spec, _), st in zip(compile_stages(model, plan), plan.stages):
        out.append({"stage": spec.index, "ops": len(spec.ops), "planned_ms": st.compute_s * 1e3,
                    "compiled_ms": spec.predicted_ms,
                    "error_pct": 100 * (spec.predicted_ms - st.compute_s * 1e3) / (st.compute_s * 1e3)})
    return out


class _NoWork:
    """A DPU that does no work: a stage run on it times only its host part."""

    def __init__(self, arch):
        self.arch = arch

    def execute(self, sg, regions) -> None:
        pass


def host_check(runs: int, boards: int) -> list[dict]:
    """The host cost model against the host measured: the reduced ResNet-50 in `boards` stages on the local
    executor, each stage's model on a DPU that does no work, so a stage's busy time is host time only (wire in,
    VM call, quantize, driver, DMA, dequantize, wire out); beside it the model's prediction for that stage."""
    import tvm_dpu
    from tvm_dpu import zoo
    from tvm_dpu.pipeline.model import PipelineModel

    frames = [zoo.random_input("resnet50", reduced=True, seed=s) for s in range(runs)]
    single = tvm_dpu.build(zoo.build_model("resnet50", reduced=True), arch="zcu102", calibration=frames[:2],
                           progress=False)
    pipe = PipelineModel.from_model(single, boards=boards)
    for st in pipe.stages:
        st.model.pin(_NoWork(st.model.arch))
    list(pipe.run_stream(frames[:2], max_in_flight=1))
    before = pipe.stage_stats()
    list(pipe.run_stream(frames, max_in_flight=1))
    after = pipe.stage_stats()
    pipe.close()
    out = []
    for st, b, a, planned in zip(pipe.stages, before, after, pipe.plan["stages"]):
        k = a["runs"] - b["runs"]
        out.append({"stage": st.spec.index, "measured_host_ms": (a["busy_s"] - b["busy_s"]) / k * 1e3,
                    "measured_wire_ms": (a["wire_s"] - b["wire_s"]) / k * 1e3,
                    "predicted_host_ms": planned["host_ms"], "send_bytes": st.spec.send_bytes})
    return out


def executor_overhead(runs: int, boards: int) -> list[dict]:
    import numpy as np

    import tvm_dpu
    from tvm_dpu import zoo
    from tvm_dpu.pipeline.model import PipelineModel

    frames = [zoo.random_input("resnet50", reduced=True, seed=s) for s in range(runs)]
    single = tvm_dpu.build(zoo.build_model("resnet50", reduced=True), arch="zcu102", calibration=frames[:2],
                           progress=False)
    pipe = PipelineModel.from_model(single, boards=boards)
    out = []
    executors = ["local"]
    try:
        import ray  # noqa: F401

        executors.append("ray")
    except ImportError:
        print("ray not installed: skipping the ray executor", file=sys.stderr)
    for ex in executors:
        pipe.close()
        pipe.executor = ex
        list(pipe.run_stream(frames[:2], max_in_flight=1))  # start actors / link libraries
        # Frames one at a time: wall time per frame vs the stages' own time for it, measured where they run.
        before = sum(s["busy_s"] for s in pipe.stage_stats())
        through = []
        for x in frames:
            t0 = time.perf_counter()
            list(pipe.run_stream([x], max_in_flight=1))
            through.append(time.perf_counter() - t0)
        own = (sum(s["busy_s"] for s in pipe.stage_stats()) - before) / len(frames)
        t0 = time.perf_counter()
        outs = list(pipe.run_stream(frames, max_in_flight=boards))
        streamed = time.perf_counter() - t0
        same = all(np.array_equal(a[0], single.run(x)[0]) for a, x in zip(outs, frames))
        out.append({"executor": ex, "stages": boards, "frames": runs,
                    "stage_run_ms_mean": own * 1e3,
                    "frame_ms_mean": statistics.mean(through) * 1e3,
                    "frame_ms_median": statistics.median(through) * 1e3,
                    "overhead_ms_per_frame": (statistics.mean(through) - own) * 1e3,
                    "streamed_fps": runs / streamed, "sequential_fps": 1 / statistics.mean(through),
                    "bit_identical": same})
    pipe.close()
    return out


DOCS = Path(__file__).resolve().parents[1] / "docs" / "pipeline.md"
BEGIN, END = "<!-- bench_pipeline:begin -->", "<!-- bench_pipeline:end -->"


def why(row: dict) -> str:
    """What costs a row its efficiency: the host when the same plan without it scales (DPU + link only >= 90%)."""
    if "dpu_only_efficiency" in row and row["dpu_only_efficiency"] >= 0.9 > row["efficiency"]:
        return (f"host time (without it {row['dpu_only_efficiency'] * 100:.0f}%; bottleneck "
                f"{row['bottleneck']})")
    return row["limit"]


def docs_section(data: dict) -> str:
    """The measured section of docs/pipeline.md, from the benchmark JSON."""
    rows = data["rows"]
    lines = [f"Generated from `benchmarks/results/pipeline.json` (`python benchmarks/bench_pipeline.py "
             f"--write-docs`). ResNet-50 ({'reduced' if data['reduced'] else 'full size'}), predicted by the "
             "timing model, the measured host cost model (tvm_dpu/timing/host.py, `benchmarks/bench_host.py`; "
             "measured on the development host, not a board's ARM cores) and the link model: end to end per frame, "
             "DPU + host + link, int8 passed through between stages and each stage double-buffered (host beside "
             "DPU); efficiency = speedup / boards. GOPS (1/MAC) counts one op per MAC, the paper's unit; "
             "GOPS (2/MAC) two. Serial host: the same with the host strictly serial with the DPU. DPU only: the "
             "plan without the host, as these figures were counted before.", "",
             "| arch | link | boards | frames/s | efficiency | GOPS (1/MAC) | GOPS (2/MAC) | serial-host frames/s | "
             "serial-host efficiency | DPU-only frames/s | DPU-only efficiency | bottleneck |",
             "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |"]
    for r in rows:
        lines.append(f"| {r['arch']} | {r['link']} | {r['boards']} | {r['fps']:.1f} | {r['efficiency'] * 100:.0f}% | "
                     f"{r['gops_1op_per_mac']:.0f} | {r['gops']:.0f} | {r['serial_host_fps']:.1f} | "
                     f"{r['serial_host_efficiency'] * 100:.0f}% | {r['dpu_only_fps']:.1f} | "
                     f"{r['dpu_only_efficiency'] * 100:.0f}% | {r['bottleneck']} |")
    lines += ["", "Against the goal of >= 90% of linear scaling up to the largest board count:"]
    for arch in dict.fromkeys(r["arch"] for r in rows):
        for link in dict.fromkeys(r["link"] for r in rows):
            sel = [r for r in rows if r["arch"] == arch and r["link"] == link]
            if not sel:
                continue
            last = sel[-1]
            below = [r for r in sel if r["efficiency"] < 0.9]
            verdict = (f"met ({last['efficiency'] * 100:.0f}% on {last['boards']} boards)" if not below else
                       f"missed from {below[0]['boards']} boards ({below[0]['efficiency'] * 100:.0f}%; "
                       f"{last['efficiency'] * 100:.0f}% on {last['boards']}), limited by {why(below[0])}")
            lines.append(f"- {arch}, {link}: {verdict}; at most {max(r['fps'] for r in sel):.1f} frames/s, "
                         f"{max(r['gops_1op_per_mac'] for r in sel):.0f} GOPS (1 op/MAC).")
    scaled = data.get("host_scale_rows") or []
    if scaled:
        lines += ["", f"The host figures are this x86 machine's; a board's Cortex-A53 cores are slower by a factor not "
                  f"measured here. The same plans with every host cost multiplied ({scaled[0]['arch']}, "
                  f"{scaled[0]['link']}; efficiency double-buffered / host serial, bottleneck):"]
        for f in dict.fromkeys(r["host_scale"] for r in scaled):
            sel = [r for r in scaled if r["host_scale"] == f]
            lines.append(f"- host x{f:g}: " + "; ".join(
                f"{r['boards']} boards {r['efficiency'] * 100:.0f}% / {r['serial_host_efficiency'] * 100:.0f}%"
                for r in sel) + f" (at {sel[-1]['boards']}: {sel[-1]['bottleneck']}).")
    paper = data["paper"]
    fps = {str(k): v for k, v in paper["fps"].items()}  # JSON object keys are strings
    gops = {str(k): v for k, v in paper["gops"].items()}
    lines += ["", f"The paper (its own HLS accelerator at 100 MHz on each board, serial links, measured on its boards; "
              f"GOPS = 1 op per MAC): 4 boards {fps['4']} FPS / {gops['4']:.0f} GOPS, 5 boards {gops['5']:.0f} GOPS; "
              f"{paper['shape']}.", ""]
    if data.get("host_check"):
        lines.append("Host cost model against the host measured (reduced ResNet-50 in 3 stages on DPUs that do no "
                     "work, local executor, ms per frame): " + "; ".join(
                         f"stage {h['stage']} measured {h['measured_host_ms']:.3f} (wire {h['measured_wire_ms']:.3f}), "
                         f"predicted {h['predicted_host_ms']:.3f}" for h in data["host_check"]) + ".")
        lines.append("")
    c = data["stage_check"]
    lines.append(f"Stages of the {c['boards']}-board plan ({c['arch']}, {c['link']}) compiled for real and their "
                 "programs simulated, against the planner's per-op estimate: " + "; ".join(
                     f"stage {s['stage']} {s['compiled_ms']:.3f} ms ({s['error_pct']:+.1f}%)" for s in c["stages"])
                 + ".")
    lines += ["", "Executor cost per frame on this 2-core machine (reduced ResNet-50 in 3 emulated stages, means over "
              "frames sent one at a time; overhead = a frame's wall time through `run_stream(max_in_flight=1)` minus "
              "the stages' own run time, measured where they run: threads here, or inside the Ray actors):", "",
              "| executor | stages' own ms | frame ms | overhead ms | sequential frames/s | streamed frames/s |",
              "| --- | ---: | ---: | ---: | ---: | ---: |"]
    for o in data["executor_overhead"]:
        lines.append(f"| {o['executor']} | {o['stage_run_ms_mean']:.1f} | {o['frame_ms_mean']:.1f} | "
                     f"{o['overhead_ms_per_frame']:.1f} | {o['sequential_fps']:.1f} | {o['streamed_fps']:.1f} |")
    return "\n".join(lines)


def write_docs(data: dict, path: Path = DOCS) -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from docblock import write_block  # benchmarks/docblock.py

    write_block(path, BEGIN, END, docs_section(data))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--archs", default="dnnvm-zu2,ultra96", help="board presets (default: a B1152-class board "
                    "and Ultra96's B1600)")
    ap.add_argument("--links", default="serial-8.5g,gbe,ray-gbe,serial-8.5g-blocking")
    ap.add_argument("--max-boards", type=int, default=8)
    ap.add_argument("--quick", action="store_true", help="reduced ResNet-50 (checks the script)")
    ap.add_argument("--runs", type=int, default=12, help="frames for the executor overhead")
    ap.add_argument("--json", type=Path, default=DEFAULT_JSON)
    ap.add_argument("--host-scales", default="1,2,4",
                    help="host cost factors for the sensitivity rows (first arch and link; 1 = as measured here)")
    ap.add_argument("--write-docs", action="store_true",
                    help="only rewrite the measured section of docs/pipeline.md from --json (no run)")
    args = ap.parse_args()
    if args.write_docs:
        write_docs(json.loads(args.json.read_text()))
        print(f"wrote the measured section of {DOCS} from {args.json}")
        return 0

    import tvm_dpu
    from tvm_dpu import zoo
    from tvm_dpu.xgraph.ops import op_macs

    archs = [a for a in args.archs.split(",") if a]
    links = [a for a in args.links.split(",") if a]
    model_proto = zoo.build_model("resnet50", reduced=args.quick)
    calib = [zoo.random_input("resnet50", reduced=args.quick, seed=s) for s in range(2)]
    rows, checks, build_s, sensitivity = [], {}, {}, []
    for arch in archs:
        t0 = time.perf_counter()
        model = tvm_dpu.build(model_proto, arch=arch, calibration=calib, progress=False)
        build_s[arch] = time.perf_counter() - t0
        graph = next(iter(model.runners.values())).graph
        macs = sum(op_macs(op, graph) for op in graph.ops)
        rows += predict(model, arch, links, args.max_boards, macs)
        if arch == archs[0]:
            # the host figures are this machine's; a board's Cortex-A53 cores are slower by a factor not measured
            # here: how the plan fares if the host costs that many times more
            scales = [float(f) for f in args.host_scales.split(",") if f.strip()]
            sensitivity = [{k: r[k] for k in ("arch", "link", "boards", "fps", "efficiency", "bottleneck",
                                              "host_scale", "serial_host_fps", "serial_host_efficiency")}
                           for f in scales for r in predict(model, arch, links[:1], args.max_boards, macs, f)]
            checks = {"arch": arch, "link": links[0], "boards": 4,
                      "stages": stage_check(model, arch, links[0], min(4, args.max_boards))}
        del model

    print(f"ResNet-50 ({'reduced' if args.quick else 'full size'}) pipelined over boards, predicted end to end: "
          "DPU (timing model) + host (measured host cost model, this machine; int8 passed through between stages, "
          "stages double-buffered) + link; GOPS(1) = 1 op per MAC (the paper's unit), GOPS(2) = 2 ops per MAC; "
          "'serial host' = the host strictly serial with the DPU; 'DPU only' = DPU + link, as counted before")
    print(f"{'arch':<10} {'link':<12} {'boards':>6} {'frames/s':>9} {'eff':>5} {'GOPS(1)':>8} {'GOPS(2)':>8} "
          f"{'serial-host f/s':>15} {'eff':>5} {'DPU-only f/s':>12} {'eff':>5}  bottleneck")
    for r in rows:
        print(f"{r['arch']:<10} {r['link']:<12} {r['boards']:>6} {r['fps']:>9.1f} {r['efficiency'] * 100:>4.0f}% "
              f"{r['gops_1op_per_mac']:>8.1f} {r['gops']:>8.1f} {r['serial_host_fps']:>15.1f} "
              f"{r['serial_host_efficiency'] * 100:>4.0f}% {r['dpu_only_fps']:>12.1f} "
              f"{r['dpu_only_efficiency'] * 100:>4.0f}%  {r['bottleneck']}")
    print(f"\nhost cost x factor (a board's ARM cores against this machine; not measured), {archs[0]}, {links[0]}:")
    for r in sensitivity:
        print(f"  host x{r['host_scale']:g} {r['boards']} boards: {r['fps']:.1f} frames/s, "
              f"{r['efficiency'] * 100:.0f}% ({r['bottleneck']}); host serial {r['serial_host_efficiency'] * 100:.0f}%")
    print(f"paper (PYNQ cluster, own HLS accelerator @100 MHz, serial links, measured on the boards; GOPS = 1 op "
          f"per MAC, 3.88e9 ops per frame): 4 boards {PAPER['fps'][4]} FPS / {PAPER['gops'][4]:.0f} GOPS, 5 boards "
          f"{PAPER['gops'][5]:.0f} GOPS; {PAPER['shape']}")
    print(f"\nstage programs compiled for the {checks['boards']}-board plan ({checks['arch']}, {checks['link']}):")
    for c in checks["stages"]:
        print(f"  stage {c['stage']}: {c['ops']:>3} ops, planned {c['planned_ms']:.3f} ms, compiled "
              f"{c['compiled_ms']:.3f} ms ({c['error_pct']:+.1f}%)")
    hosts = host_check(args.runs, 3)
    print("\nhost cost model vs host measured (reduced ResNet-50, 3 stages on DPUs that do no work, local executor, "
          "this machine; ms per frame):")
    for h in hosts:
        print(f"  stage {h['stage']}: measured {h['measured_host_ms']:.3f} (wire {h['measured_wire_ms']:.3f}), "
              f"predicted {h['predicted_host_ms']:.3f}")
    overhead = executor_overhead(args.runs, 3)
    print("\nexecutor overhead (reduced ResNet-50, 3 emulated stages, means over "
          f"{args.runs} frames one at a time, this machine; stages' own time measured where they run):")
    print(f"{'executor':<8} {'stages ms':>9} {'frame ms':>9} {'overhead ms':>11} {'seq fps':>8} {'stream fps':>10}  "
          "bit-identical")
    for o in overhead:
        print(f"{o['executor']:<8} {o['stage_run_ms_mean']:>9.2f} {o['frame_ms_mean']:>9.2f} "
              f"{o['overhead_ms_per_frame']:>11.2f} {o['sequential_fps']:>8.1f} {o['streamed_fps']:>10.1f}  "
              f"{o['bit_identical']}")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    write_results(args.json, {"model": "resnet50", "reduced": args.quick, "rows": rows,
                                     "stage_check": checks, "executor_overhead": overhead, "paper": PAPER,
                                     "host_check": hosts, "host_scale_rows": sensitivity, "units": {
                                         "fps": "frames/s, predicted end to end (DPU + host + link)",
                                         "gops_1op_per_mac": "GOPS counting 1 op per MAC (the paper's unit)",
                                         "gops": "GOPS counting 2 ops per MAC"},
                                     "build_s": build_s})
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
