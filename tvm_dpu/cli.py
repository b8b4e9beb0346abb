"""The `tvm-dpu` command line (like vai_c): one subcommand per task.

Subcommands are rows of `COMMAND_LIST` (name, help, arguments as data, the function running it, which
returns the exit code); options several commands share are defined once. Errors raised on purpose by tvm-dpu
(`tvm_dpu.errors.DPUError`: bad arch, bad model, bad shape, ...) and OS errors on user paths are printed as
one line ``tvm-dpu: error: ...`` on stderr with exit code 2 (user error), without a traceback. Heavy imports
(TVM) happen inside the subcommands so that ``--help`` stays fast.
"""
from __future__ import annotations

import argparse
import atexit
import gc
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

from . import __version__
from .errors import DPUError, FrontendError, did_you_mean

PROG = "tvm-dpu"
EXIT_OK = 0
EXIT_USER_ERROR = 2


# ---------------------------------------------------------------------------------------------------------
# Shared argument parsing helpers
# ---------------------------------------------------------------------------------------------------------
def parse_input_shape(text: str) -> tuple[str, list[int]]:
    """Parse ``NAME=1,3,224,224`` into ``("NAME", [1, 3, 224, 224])`` (FrontendError if malformed)."""
    name, sep, dims = text.rpartition("=")
    if not sep or not name:
        raise FrontendError(f"bad --input-shape {text!r}: expected NAME=D1,D2,... (e.g. input=1,3,224,224)")
    try:
        shape = [int(d) for d in dims.split(",")]
    except ValueError:
        raise FrontendError(
            f"bad --input-shape {text!r}: dimensions must be comma-separated integers (e.g. {name}=1,3,224,224)"
        ) from None
    if any(d <= 0 for d in shape):
        raise FrontendError(f"bad --input-shape {text!r}: dimensions must be positive")
    return name, shape


def parse_input_shapes(items: Sequence[str] | None) -> dict[str, list[int]] | None:
    """All ``--input-shape`` options as a dict (None when there are none); a name given twice is an error."""
    if not items:
        return None
    shapes: dict[str, list[int]] = {}
    for item in items:
        name, shape = parse_input_shape(item)
        if name in shapes:
            raise FrontendError(f"--input-shape given twice for input {name!r}")
        shapes[name] = shape
    return shapes



def _input_file(text: str | None, flag: str = "") -> Path | None:
    """The path of an input file a command reads (None when not given); FrontendError when there is none."""
    if text is None:
        return None
    path = Path(text)
    if not path.is_file():
        why = "is a directory" if path.is_dir() else "is not a regular file" if path.exists() else "no such file"
        raise FrontendError(f"{flag}{path}: {why}")
    return path


def _load_model(args: argparse.Namespace):
    """(arch, Relax module) from the common model arguments; user mistakes raise DPUError subclasses."""
    from .arch import load_arch

    arch = load_arch(args.arch)
    shapes = parse_input_shapes(args.input_shape)
    path = Path(args.model)
    if not path.exists():
        raise FrontendError(f"{path}: no such file")
    if path.is_dir():
        raise FrontendError(f"{path}: is a directory, expected an ONNX file")
    from .builder import import_model

    # QDQ stripped exactly as compile strips it
    return arch, _reporting_warnings(import_model, str(path), shapes, requantize=args.requantize)[0]


# ---------------------------------------------------------------------------------------------------------
# partition
# ---------------------------------------------------------------------------------------------------------
def _run_partition(args: argparse.Namespace) -> int:
    arch, mod = _load_model(args)
    from .passes import partition

    _, report = partition(mod, arch)
    print(report.table())
    if args.json:
        report.save_json(args.json)
        print(f"wrote {args.json}")
    return EXIT_OK



# ---------------------------------------------------------------------------------------------------------
# compile
# ---------------------------------------------------------------------------------------------------------
#: Keys of vai_c's --options that tvm-dpu understands.
VAI_C_OPTIONS = ("input_shape", "output_ops", "plugins")


#: The largest count option accepted (--runs, --threads, --boards, ...): a million runs of the smallest model take
#: hours; a larger number is a typo, not a plan.
MAX_COUNT = 1_000_000


def positive_int(text: str) -> int:
    """argparse type of a count option (cores, runs, boards, ...): a whole number from 1 to MAX_COUNT."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} must be at least 1")
    if value > MAX_COUNT:
        raise argparse.ArgumentTypeError(f"{value} is more than {MAX_COUNT:,}")
    return value


def vai_plugins(text: str | None) -> list[str]:
    """The ``plugins`` of vai_c-style ``--options`` ("a,b": custom-IP plugins applied in order before DPU
    partitioning). The JSON itself is checked by `parse_vai_options`."""
    import json

    if not text:
        return []
    return [p.strip() for p in str(json.loads(text).get("plugins", "")).split(",") if p.strip()]


def parse_vai_options(text: str | None, input_names: Sequence[str]) -> tuple[dict[str, list[int]], list[str]]:
    """vai_c-style ``--options`` JSON -> (input shapes by name, output op names).

    ``input_shape``: "1,3,224,224" for the first input, several inputs separated by ";" in model input order;
    ``output_ops``: comma-separated ONNX node (or output tensor) names at which to cut the model;
    ``plugins``: see `vai_plugins`.
    """
    from .schema import SchemaError, parse_json

    if not text:
        return {}, []
    try:
        opts = parse_json(text, 1 << 20)
    except SchemaError as e:
        raise FrontendError(f"--options is not valid JSON ({e}): expected e.g. "
                            '\'{"input_shape": "1,3,224,224", "output_ops": "fc"}\'') from None
    if not isinstance(opts, dict):
        raise FrontendError("--options must be a JSON object, e.g. '{\"input_shape\": \"1,3,224,224\"}'")
    unknown = sorted(set(opts) - set(VAI_C_OPTIONS))
    if unknown:
        raise FrontendError(f"--options: unknown key(s) {unknown}; tvm-dpu understands {list(VAI_C_OPTIONS)}")
    shapes: dict[str, list[int]] = {}
    if "input_shape" in opts:
        parts = [p.strip() for p in str(opts["input_shape"]).split(";") if p.strip()]
        if len(parts) > len(input_names):
            raise FrontendError(f"--options input_shape gives {len(parts)} shapes but the model has "
                                f"{len(input_names)} input(s) {list(input_names)}")
        for name, part in zip(input_names, parts):
            shapes[name] = parse_input_shape(f"{name}={part}")[1]
    outs = [o.strip() for o in str(opts.get("output_ops", "")).split(",") if o.strip()]
    return shapes, outs


def _cut_model(model, output_ops: list[str]):
    """The ONNX model truncated so that `output_ops` (node or tensor names) are its outputs."""
    import onnx
    from onnx import helper

    producers = {}
    for node in model.graph.node:
        for out in node.output:
            producers[out] = node
    by_node = {n.name: n for n in model.graph.node if n.name}
    tensors = []
    for name in output_ops:
        if name in by_node:
            tensors.append(by_node[name].output[0])
        elif name in producers:
            tensors.append(name)
        else:
            raise FrontendError(f"--options output_ops: {name!r} is neither a node nor a tensor of the model")
    needed, stack = set(), list(tensors)
    while stack:
        t = stack.pop()
        node = producers.get(t)
        if node is None or id(node) in needed:
            continue
        needed.add(id(node))
        stack.extend(node.input)
    nodes = [n for n in model.graph.node if id(n) in needed]
    used = {i for n in nodes for i in n.input}
    inputs = [i for i in model.graph.input if i.name in used]
    inits = [i for i in model.graph.initializer if i.name in used]
    inferred = onnx.shape_inference.infer_shapes(model)
    typed = {vi.name: vi for vi in [*inferred.graph.value_info, *inferred.graph.output, *inferred.graph.input]}
    untyped = [t for t in tensors if t not in typed]
    if untyped:
        raise FrontendError(f"--options output_ops: ONNX shape inference gives no type for {untyped}")
    outputs = [typed[t] for t in tensors]
    graph = helper.make_graph(nodes, model.graph.name, inputs, outputs, inits)
    cut = helper.make_model(graph, opset_imports=model.opset_import, ir_version=model.ir_version)
    try:
        onnx.checker.check_model(cut)
    except onnx.checker.ValidationError as e:
        raise FrontendError(f"--options output_ops {output_ops}: the cut model is invalid: {e}") from None
    return cut


def _reporting_warnings(fn: Callable, *args, **kwargs):
    """fn(*args, **kwargs), its warnings (random calibration, rounded QDQ scales, ...) printed as one line each."""
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = fn(*args, **kwargs)
    for w in caught:
        print(f"{PROG}: warning: {w.message}", file=sys.stderr)
    return result


def _build_reporting_warnings(source, **options):
    """tvm_dpu.build(source, **options), its warnings printed as one line each."""
    from .builder import build

    return _reporting_warnings(build, source, **options)


def _compile_source(args: argparse.Namespace, path: Path, shapes: dict, clock: Any) -> tuple[Any, Any]:
    """The model to build (read lazily, cut at the options' outputs) and its ONNX node graph for the report;
    `shapes` gains the options' input shapes."""
    from .frontend.onnx_import import NamedModel
    from .frontend.onnx_lazy import load_lazy, with_weights
    from .report_html import onnx_node_graph

    try:
        proto = load_lazy(str(path))  # the large weights stay in the file until the import reads them
    except Exception as e:  # onnx raises DecodeError / ValueError variously on a malformed file
        raise FrontendError(f"{path}: not a readable ONNX model ({type(e).__name__}: {e})") from None
    clock.lap("read_model")
    init_names = {i.name for i in proto.graph.initializer}
    input_names = [i.name for i in proto.graph.input if i.name not in init_names]
    opt_shapes, output_ops = parse_vai_options(args.options, input_names)
    for k, v in opt_shapes.items():
        shapes.setdefault(k, v)
    if output_ops:  # cutting copies initializers and checks the cut model: with their values
        proto = _cut_model(with_weights(proto), output_ops)
    # Errors name the file (and the cut); the import reuses the model parsed here.
    source_graph = onnx_node_graph(proto)
    # Handed over: the import takes the parsed model out of it, so nothing here keeps the model (a VGG-16 is
    # 0.5 GB) alive once it is imported.
    return NamedModel(proto, f"{path} (cut at {', '.join(output_ops)})" if output_ops else str(path)), source_graph


def _export_timed(model: Any, args: argparse.Namespace, outdir: Path, name: str, clock: Any) -> tuple[Path, Any, list]:
    """Export the artifact (and the xmodel) while the timing model and the timelines run: (artifact, timing,
    timeline files)."""
    from concurrent.futures import ThreadPoolExecutor

    from .runtime.artifact import SUFFIX, export

    def export_all() -> Path:
        written = export(model, outdir / f"{name}{SUFFIX}", cross=args.cross, verify_data=not args.no_verify_data,
                         sign=args.sign)
        if args.format == "xmodel":
            model.export(outdir / f"{name}.xmodel")
        return written

    # The export spends most of its time waiting for the C compiler to link TVM's library (a child process): the
    # timing model and the timelines, which only read the model, run meanwhile. "export" is then the time the
    # export took beyond them.
    with ThreadPoolExecutor(1, thread_name_prefix="tvm-dpu-export") as pool:
        exporting = pool.submit(export_all)
        timing = _timing_or_none(model)
        clock.lap("timing_model")
        timelines = _write_timelines(model, timing, outdir, name, png=args.png) if timing is not None else []
        clock.lap("timelines")
        artifact = exporting.result()
    clock.lap("export")
    return artifact, timing, timelines


def _timing_or_none(model):
    """The model's timing, or None (said on stderr) for a family with no timing model yet (families.json)."""
    from .timing.params import TimingError

    try:
        return model.timing()
    except TimingError as e:
        print(f"{PROG}: note: {_one_line(e)}: nothing is timed", file=sys.stderr)
        return None


def _print_compiled(args: argparse.Namespace, report: dict, placement: str, artifact: Path, outdir: Path,
                    timelines: list, times: dict) -> None:
    import textwrap

    if not args.quiet:
        print(placement)
        print()
    print(_subgraph_table(report))
    if args.cores > 1:
        print(_multicore_summary(report, args.cores))
    print(f"wrote {artifact} ({artifact.stat().st_size} bytes), {outdir / 'meta.json'} and {outdir / 'report.json'}")
    if timelines:
        print(f"wrote engine timelines: {', '.join(str(p) for p in timelines)}")
    print(textwrap.fill(f"compile time {times['total_after_imports']:.1f} s (" +
                        ", ".join(f"{k.replace('_', ' ')} {v:.1f}" for k, v in times.items()
                                  if k != "total_after_imports") + ")", 120, subsequent_indent="  "))


def _run_compile(args: argparse.Namespace) -> int:
    import json

    from .arch import load_arch
    from .util.phase_times import PhaseClock
    from .runtime.artifact import read_header

    arch = load_arch(args.arch)
    shapes = parse_input_shapes(args.input_shape) or {}
    path = _input_file(args.model)
    name = args.name or path.stem
    if not name or "/" in name or name.startswith("."):
        raise FrontendError(f"-n {name!r}: the artifact name must be a plain file name")
    calib = Path(args.calib) if args.calib else None  # checked by `preflight`
    if args.cross:  # a missing cross compiler is said now, not after the whole compile
        from .util.toolchains import CROSS_TARGETS, c_compiler

        c_compiler(CROSS_TARGETS[args.cross][0])
    clock = PhaseClock()
    source, source_graph = _compile_source(args, path, shapes, clock)
    outdir = Path(args.output)
    outdir.mkdir(parents=True, exist_ok=True)
    model = _build_reporting_warnings(source, arch=arch, calibration=calib, shapes=shapes or None,
                                      progress=not args.quiet, fusion=args.fusion, plugins=vai_plugins(args.options),
                                      cores=args.cores, segments=args.segments, requantize=args.requantize)
    del source
    clock.lap("build")
    model.source_graph = source_graph
    artifact, timing, timelines = _export_timed(model, args, outdir, name, clock)
    # Where a compile's time goes, end to end (the build's own phases plus what the CLI does after it), in wall and
    # in process seconds.
    times = model.build_info.setdefault("times_s", {})
    cpu_times = model.build_info.setdefault("cpu_times_s", {})
    for key in ("read_model", "export", "timing_model", "timelines"):
        times[key], cpu_times[key] = clock.wall[key], clock.cpu[key]
    report = model.report(timing)
    placement = model.partition_report.table()
    del model, timing  # the compiled model (weights, VM) is not needed to describe the written artifact
    gc.collect()
    header, sizes = read_header(artifact)
    (outdir / "meta.json").write_text(json.dumps(artifact_meta(header, sizes, artifact), indent=2) + "\n")
    times["total_after_imports"], cpu_times["total_after_imports"] = clock.since_start()
    report["build"]["times_s"] = times
    report["build"]["cpu_times_s"] = cpu_times
    (outdir / "report.json").write_text(json.dumps(report, indent=2) + "\n")
    _print_compiled(args, report, placement, artifact, outdir, timelines, times)
    return EXIT_OK


def _multicore_summary(report: dict, cores: int) -> str:
    """One line per DPU subgraph compiled for several cores, then the model's predicted DPU latency."""
    lines = []
    for sym, info in sorted((report.get("build") or {}).get("multicore", {}).items()):
        sid = next((s["id"] for s in report["subgraphs"] if s["symbol"] == sym), sym)
        lines.append(f"subgraph {sid}: {info['reason']}")
    t = report.get("timing") or {}
    if f"latency_ms_cores_{cores}" in t:
        lines.append(f"predicted DPU latency: {t['latency_ms_cores_1']:.3f} ms on 1 core, "
                     f"{t[f'latency_ms_cores_{cores}']:.3f} ms on {cores} cores "
                     f"(predicted gain {t['predicted_gain_percent']:.1f}%)")
    return "\n".join(lines)


def _write_timelines(model, timing, outdir: Path, name: str, png: bool = False) -> list[Path]:
    """Per DPU subgraph: a Chrome trace (open in Perfetto) and, with `png` and matplotlib installed, a PNG Gantt
    chart (opt-in: importing matplotlib and drawing cost more than the trace); per subgraph compiled for several
    cores, its schedule as a trace with one track per core."""
    import json
    import warnings

    from .timing.trace import write_chrome_trace, write_gantt_png

    written = []
    for symbol, trace in model.core_timelines().items():
        sid = model.subgraph_ids.get(symbol, symbol)
        path = outdir / f"{name}.sg{sid}.cores.trace.json"
        path.write_text(json.dumps(trace))
        written.append(path)
    for symbol, result in timing.subgraphs.items():
        sid = model.subgraph_ids.get(symbol, symbol)
        written.append(write_chrome_trace(result, outdir / f"{name}.sg{sid}.trace.json"))
        if not png:
            continue
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # no matplotlib: the trace alone
            png = write_gantt_png(result, outdir / f"{name}.sg{sid}.png", title=f"{name} DPU subgraph {sid}")
        if png is not None:
            written.append(png)
    return written


def artifact_meta(header: dict, sizes: dict[str, int], path: Path) -> dict:
    """meta.json (like vai_c's): arch, model inputs/outputs, and per DPU subgraph its tensors with fix_points."""
    import hashlib

    return {
        "name": path.stem,
        "artifact": path.name,
        "artifact_bytes": path.stat().st_size,
        "artifact_sha256": hashlib.sha256(path.read_bytes()).hexdigest(),
        "tvm_dpu_version": __version__,
        "arch": header["arch"],
        "cpu_libs": header.get("cpu_libs"),
        "inputs": header["inputs"],
        "outputs": header.get("outputs") or [],
        "subgraphs": [{
            "id": s.get("id"), "symbol": s["symbol"], "name": s["name"],
            "inputs": [{"name": b["name"], "shape": b["shape"], "fix_point": b["fix_point"]} for b in s["inputs"]],
            "outputs": [{"name": b["name"], "shape": b["shape"], "fix_point": b["fix_point"]} for b in s["outputs"]],
            "instructions": int(sum(s["instr_counts"].values())),
            "code_bytes": s["code_bytes"],
            "param_bytes": s["param_bytes"],
            "multicore": s.get("multicore"),
        } for s in header["subgraphs"]],
        "plugin_subgraphs": header.get("plugin_subgraphs") or [],
    }


#: Compute instructions the subgraph table counts, in this order, where a subgraph has any (ALU is DPUCZDX8G's,
#: POOL and DPTWISE DPUCAHX8H's own engines).
_TABLE_ENGINES = ("CONV", "ALU", "POOL", "DPTWISE", "ELEW")


def _subgraph_table(report: dict) -> str:
    # "nodes": the model's (ONNX) nodes the subgraph computes; "ops": the coarse DPU ops they became.
    nodes = (report.get("partition") or {}).get("nodes") or []
    counts = [s["instruction_counts"] for s in report["subgraphs"]]
    engines = [e for e in _TABLE_ENGINES if e == "CONV" or any(c.get(e) for c in counts)] + ["LOAD", "SAVE"]
    rows = [("subgraph", "nodes", "ops", "instructions", *engines, "DDR bytes")]
    for s, c in zip(report["subgraphs"], counts):
        n_nodes = sum(1 for n in nodes if n.get("device") == "dpu" and n.get("subgraph") == s["id"])
        rows.append((str(s["id"]), str(n_nodes), str(s["ops"]), str(s["instructions"]),
                     *(str(c.get(e, 0)) for e in engines), str(sum(s["ddr_bytes"].values()))))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(cell.rjust(w) for cell, w in zip(r, widths)) for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    lines.append(f"{len(report['subgraphs'])} DPU subgraph(s) for {report['dpu']} ({report['arch']}), "
                 f"DDR {report['ddr_total_bytes']} bytes")
    return "\n".join(lines)



# ---------------------------------------------------------------------------------------------------------
# run
# ---------------------------------------------------------------------------------------------------------
def _print_outputs(outputs: list, names: Sequence[str] | None = None) -> None:
    import numpy as np

    for i, y in enumerate(outputs):
        flat = y.reshape(-1)
        top = ", ".join(f"{int(k)}:{flat[k]:.4f}" for k in np.argsort(-flat)[:5])
        label = f"{i} ({names[i]})" if names and i < len(names) else str(i)
        print(f"output {label}: shape {tuple(y.shape)}, top-5 [{top}]")


def _save_outputs(path: str, outputs: list, names: Sequence[str] | None) -> None:
    """The outputs as an .npz under the model's output names (output_<i> where a model names none)."""
    import numpy as np

    keys = list(names) if names and len(names) == len(outputs) and len(set(names)) == len(names) else \
        [f"output_{i}" for i in range(len(outputs))]
    np.savez(path, **dict(zip(keys, outputs)))
    print(f"wrote {path} (arrays {', '.join(keys)})")


def _is_pipeline(path: str) -> bool:
    p = Path(path)
    return p.suffix == ".json" or (p.is_dir() and (p / "pipeline.json").is_file())


def _run_pipeline_file(args: argparse.Namespace) -> int:
    from .pipeline.model import PipelineModel

    if args.verify:
        raise FrontendError("--verify runs on one artifact; verify each stage with 'tvm-dpu run stageN.tvmdpu "
                            "--verify', or compare with the single-board run ('tvm-dpu pipeline' checks it)")
    for flag, bad in (("--cores", args.cores), ("--runs", args.runs != 1)):
        if bad:
            raise FrontendError(f"{flag} is for artifacts; a pipeline runs one stage per board")
    if len(args.input or []) > 1:
        raise FrontendError(f"--input given {len(args.input)} times for one pipeline")
    if args.device == "pynq" and args.executor == "local":
        raise FrontendError("--device pynq with a pipeline needs --executor ray (one board per stage actor)")
    device_options = {"bitfile": args.bitfile, "timeout_s": args.timeout} if args.device == "pynq" else {}
    pipe = PipelineModel.load(args.compiled[0], executor=args.executor, device=args.device,
                              device_options=device_options, trusted_keys=args.require_signature,
                              trust=_trust(args), min_release=args.min_release)
    path = (args.input or [None])[0]
    feeds = _feeds_for(pipe, path, "--input")
    if path is None:
        print("no --input: running on random normal input (seed 0)")
    with pipe:
        outputs = pipe.run(feeds)
    print(f"ran {len(pipe.stages)} stages with the {args.executor} executor")
    names = list(pipe.stages[-1].spec.outputs)
    _print_outputs(outputs, names)
    if args.output:
        _save_outputs(args.output, outputs, names)
    return EXIT_OK


def _is_xmodel(path: str) -> bool:
    return str(path).lower().endswith(".xmodel")


def _run_run(args: argparse.Namespace) -> int:
    if args.runs < 1:
        raise FrontendError(f"--runs {args.runs}: expected at least 1")
    pipeline = len(args.compiled) == 1 and _is_pipeline(args.compiled[0])
    if args.min_release is not None and not pipeline:
        raise FrontendError("--min-release applies to a pipeline (pipeline.json records its release); an artifact "
                            "or .xmodel has none")
    if len(args.compiled) == 1 and _is_xmodel(args.compiled[0]):
        from .xmodel.commands import run_run

        return run_run(args, _feeds_for, _print_outputs, _save_outputs)
    if pipeline:
        return _run_pipeline_file(args)
    if len(args.compiled) > 1:
        return _run_tenants(args)
    return _run_one(args)


def _trust(args: argparse.Namespace) -> str:
    if args.allow_unsigned and args.require_signature:
        raise FrontendError("--allow-unsigned and --require-signature contradict each other: give one")
    return "unsigned" if args.allow_unsigned else "auto"


def _feeds_for(model, path: str | None, what: str) -> dict:
    """Input arrays for `model` from an .npz file, or random normal input (seed 0) when `path` is None."""
    import numpy as np

    from .serving.feeds import input_shape_check, load_npz

    if path:
        feeds = load_npz(path, what, check=input_shape_check(model.inputs))
        if len(model.inputs) == 1 and model.inputs[0].name not in feeds and len(feeds) == 1:
            feeds = {model.inputs[0].name: next(iter(feeds.values()))}  # one array: whatever its name
        return feeds
    rng = np.random.default_rng(0)
    return {s.name: rng.standard_normal(s.shape).astype(np.float32) for s in model.inputs}


def _run_one(args: argparse.Namespace) -> int:
    (compiled,) = args.compiled
    if len(args.input or []) > 1:
        raise FrontendError(f"--input given {len(args.input)} times for one artifact")
    if args.device == "pynq" and args.cores:
        raise FrontendError("--cores runs on emulated cores; with --device pynq the board's driver is used as is")
    model = _load_to_run(compiled, args)
    if args.cores:
        from .runtime.cores import core_group

        model.pin(core_group(model.arch, args.cores))
    model.set_verify(args.verify)  # first: an artifact without verification data fails before any work
    path = (args.input or [None])[0]
    feeds = _feeds_for(model, path, "--input")
    if path is None:
        print("no --input: running on random normal input (seed 0)")
    if args.verify and not model.runners:
        raise DPUError(f"--verify: {compiled} has no DPU subgraph, so there is nothing to verify "
                       "(every node runs on the CPU or a plugin)")
    seconds = []
    for _ in range(args.runs):
        t0 = time.perf_counter()
        outputs = model.run(feeds)
        seconds.append(time.perf_counter() - t0)
    if args.runs > 1:
        ms = sorted(1e3 * t for t in seconds)
        print(f"{args.runs} runs: latency ms mean {sum(ms) / len(ms):.3f}, p50 {ms[len(ms) // 2]:.3f}, max {ms[-1]:.3f} "
              f"(per subgraph, threads, percentiles: tvm-dpu benchmark)")
    names = [s.name for s in model.output_specs()]
    _print_outputs(outputs, names)
    if args.output:
        _save_outputs(args.output, outputs, names)
    if args.verify:
        results = model.verify_results()
        bad = sum(r.mismatches for r in results)
        checked = len({r.subgraph for r in results})
        print(f"verify: {checked} subgraphs, {args.runs} run(s), {len(results)} subgraph calls, "
              f"{bad} mismatching elements")
        for r in results:
            for note in r.first:
                print(f"  {r.subgraph}: {note}")
        return 1 if bad else EXIT_OK
    return EXIT_OK


def _run_tenants(args: argparse.Namespace) -> int:
    """Several artifacts at once on the cores of one (emulated) device, placed by predicted DPU load, each model
    `--runs` times from its own thread; prints throughput per model and per core."""
    from .runtime.artifact import load
    from .runtime.cores import devices, serve

    for flag, bad in (("--verify", args.verify), ("-o", args.output), ("--device pynq", args.device == "pynq")):
        if bad:
            raise FrontendError(f"{flag} runs one artifact; several artifacts run together on emulated cores only")
    paths = list(args.compiled)
    inputs = list(args.input or [])
    if inputs and len(inputs) != len(paths):
        raise FrontendError(f"--input given {len(inputs)} times for {len(paths)} artifacts: give one per artifact "
                            "(in the same order) or none (random input)")
    models = [load(p, trusted_keys=args.require_signature, trust=_trust(args)) for p in paths]
    if len({int(m.arch.fingerprint) for m in models}) != 1:
        listing = ", ".join(f"{p}: {m.arch.name} ({m.arch.fingerprint:#x})" for p, m in zip(paths, models))
        raise FrontendError(f"the artifacts are compiled for different DPUs ({listing}): one device runs one DPU")
    arch = models[0].arch
    cores = devices(arch)
    n = args.cores or min(len(paths), len(cores))
    if not 1 <= n <= len(cores):
        raise FrontendError(f"--cores {n}: {arch.name} has {len(cores)} DPU core(s)")
    from .runtime.cores import place_by_load, predicted_load_s

    placement = place_by_load([predicted_load_s(m) for m in models], n)  # by predicted DPU time, not i mod N
    for m, c in zip(models, placement):
        m.pin(cores[c])
    feeds = [_feeds_for(m, inputs[i] if inputs else None, f"--input {i + 1}") for i, m in enumerate(models)]
    if not inputs:
        print("no --input: running every model on random normal input (seed 0)")
    for m, f in zip(models, feeds):  # first run apart: links each library and warms the emulators
        m.run(f)
    names = [Path(p).stem for p in paths]
    report, _ = serve(models, feeds, args.runs, names)
    print(f"{len(models)} models on {n} core(s) of {arch.name}, {args.runs} runs each, all at once:")
    print(report.table())
    return EXIT_OK



# ---------------------------------------------------------------------------------------------------------
# keygen
# ---------------------------------------------------------------------------------------------------------
def _run_keygen(args: argparse.Namespace) -> int:
    from .security.signing import generate_keypair

    priv, pub = generate_keypair(args.prefix, overwrite=args.force)
    print(f"wrote {priv} (private: sign with 'tvm-dpu compile --sign {priv}') and {pub} (public: check with "
          f"'tvm-dpu run --require-signature {pub}')")
    return EXIT_OK



# ---------------------------------------------------------------------------------------------------------
# inspect
# ---------------------------------------------------------------------------------------------------------
def _run_inspect(args: argparse.Namespace) -> int:
    import json

    from .runtime.artifact import read_code, read_header

    if _is_xmodel(args.artifact):
        from .xmodel.commands import run_inspect

        return run_inspect(args)
    path = Path(args.artifact)
    for flag, on in (("--check-xir", args.check_xir), ("--check-vart", args.check_vart)):
        if on:
            raise DPUError(f"{flag}: {path} is not an .xmodel (XIR and VART read XIR graphs; export one with "
                           "`tvm-dpu compile --format xmodel`)")
    if args.check_deps:
        from .runtime.dep_check import check_artifact, format_reports

        reports = check_artifact(path)
        print(format_reports(reports))
        return EXIT_OK if all(r.ok for per in reports.values() for r in per.values()) else EXIT_USER_ERROR
    header, sizes = read_header(path)
    meta = artifact_meta(header, sizes, path)
    meta["format_sections"] = sizes
    listings = {}
    if args.disasm:
        from .codegen.asm import disassemble
        from .runtime.device import arch_of

        codes = read_code(path)
        isa = arch_of(str(header["arch"]["name"]), int(header["arch"]["fingerprint"], 16), str(path)).instruction_set
        for s in header["subgraphs"]:
            listings[s["key"]] = disassemble(codes[s["key"]], isa)
    if args.json:
        if args.disasm:
            for sg, s in zip(meta["subgraphs"], header["subgraphs"]):
                sg["listing"] = listings[s["key"]].splitlines()
        print(json.dumps(meta, indent=2))
        return EXIT_OK
    a = header["arch"]
    kind = header.get("format") or "tvm-dpu artifact"  # or TVM's exported library (runtime/library_file.py)
    print(f"{path}: {kind}, {meta['artifact_bytes']} bytes, sha256 {meta['artifact_sha256'][:16]}...")
    print(f"arch: {a['name']} (fingerprint {a['fingerprint']}); CPU library for: "
          f"{', '.join(sorted(header.get('cpu_libs') or {'?': ''}))}")
    for kind in ("inputs", "outputs"):
        for t in meta[kind]:
            fp = f", fix_point {t['fix_point']}" if t.get("fix_point") is not None else ""
            print(f"model {kind[:-1]}: {t['name']} {tuple(t['shape'])} {t['dtype']}{fp}")
    for sg, s in zip(meta["subgraphs"], header["subgraphs"]):
        counts = ", ".join(f"{k} {v}" for k, v in sorted(s["instr_counts"].items()))
        print(f"\nsubgraph {sg['id']} {sg['name']}: {sg['instructions']} instructions ({counts})")
        sym = sg["symbol"]
        print(f"  symbol {sym}" if len(sym) <= 80 else
              f"  symbol {sym[:60]}... ({len(sym)} characters; --json gives it whole)")
        print(f"  code {sg['code_bytes']} B, params {sg['param_bytes']} B, DDR region sizes by reg_id "
              f"{ {int(k): v for k, v in s['region_sizes'].items()} }")
        if s.get("multicore"):
            m = s["multicore"]
            print(f"  {m['segments']} segments scheduled on {m['cores']} cores: predicted {m['cycles']:.0f} cycles "
                  f"(one program on one core: {m['cycles_cores_1']:.0f})")
        for kind in ("inputs", "outputs"):
            for b, raw in zip(sg[kind], s[kind]):
                f = raw["fmap"]
                print(f"  {kind[:-1]:6s} {b['name']}: shape {tuple(b['shape'])}, fix_point {b['fix_point']}, "
                      f"DDR reg {f['reg_id']} offset {f['offset']}")
        if args.disasm:
            print(listings[s["key"]], end="")
    for p in meta["plugin_subgraphs"]:
        print(f"\nplugin subgraph {p['symbol']}: device {p['device']} (plugin {p['plugin']} version {p['version']}), "
              f"nodes {', '.join(p['nodes']) or '-'}")
    return EXIT_OK



# ---------------------------------------------------------------------------------------------------------
# report
# ---------------------------------------------------------------------------------------------------------
def _run_report(args: argparse.Namespace) -> int:
    from .report_html import write_report

    out = Path(args.output)
    if getattr(args, "board", None) and not _is_xmodel(args.artifact):
        raise FrontendError("--board applies to .xmodel reports (an artifact is timed on the arch it was built for)")
    if _is_xmodel(args.artifact):
        from .xmodel.commands import run_report

        return run_report(args)
    if _is_pipeline(args.artifact):
        from .pipeline.model import read_pipeline_json
        from .report_html import render_pipeline

        doc_path = Path(args.artifact)
        doc_path = doc_path / "pipeline.json" if doc_path.is_dir() else doc_path
        doc = read_pipeline_json(doc_path)
        out.write_text(render_pipeline(doc, doc_path.parent.name), encoding="utf-8")
        print(f"wrote {out} ({out.stat().st_size} bytes): {len(doc['stages'])}-stage pipeline")
        return EXIT_OK
    info = write_report(Path(args.artifact), out)
    print(f"wrote {out} ({out.stat().st_size} bytes): {info}")
    return EXIT_OK



# ---------------------------------------------------------------------------------------------------------
# pipeline
# ---------------------------------------------------------------------------------------------------------
def _run_pipeline(args: argparse.Namespace) -> int:
    import dataclasses
    import json

    import numpy as np

    from .pipeline.model import PipelineModel, boards_for, release_key
    from .pipeline.plan import default_link, load_link
    from .report_html import render_pipeline

    release_key(args.release, "--release")

    path = _input_file(args.model)
    if args.boards < 1:
        raise FrontendError(f"--boards {args.boards}: a pipeline needs at least one board")
    calib = Path(args.calib) if args.calib else None  # checked by `preflight`
    args.link = args.link or default_link(args.executor)
    load_link(args.link)  # a bad --link fails before the compile
    if (args.arch is None) == (args.part is None):
        raise FrontendError("give either --arch (each board's DPU) or --part (each board's FPGA part: the DPU is "
                            "chosen by design-space exploration)")
    ddr = None if args.ddr_mib is None else int(args.ddr_mib) * 1024 * 1024
    boards = boards_for(args.arch, args.boards, ddr) if args.arch else None
    model = _build_reporting_warnings(str(path), arch=boards[0].arch if boards else "B4096", calibration=calib,
                                      shapes=parse_input_shapes(args.input_shape), progress=not args.quiet,
                                      fusion=args.fusion)
    if boards is None:
        from .pipeline.dse import choose_boards, device_budget

        parts = [p.strip() for p in args.part.split(",") if p.strip()]
        if len(parts) == 1:
            parts *= args.boards
        if len(parts) != args.boards:
            raise FrontendError(f"--part: {len(parts)} parts for {args.boards} boards (give one, or one per board)")
        boards = choose_boards(model, [device_budget(p) for p in parts], ddr or 2048 * 1024 * 1024,
                               fusion=args.fusion)
        # the part is the board kind a Ray cluster places each stage on ("dpu_board:zu9eg")
        boards = [dataclasses.replace(b, part=part.lower()) for b, part in zip(boards, parts)]
        for b, part in zip(boards, parts):
            print(f"{b.name}: {part} -> {b.arch} (fastest single-core DPU that fits, design-space exploration)")
    pipe = PipelineModel.from_model(model, boards, link=args.link, fusion=args.fusion, executor=args.executor)
    outdir = Path(args.output)
    doc_path = pipe.save(outdir, sign=args.sign, release=args.release)
    doc = json.loads(doc_path.read_text())
    (outdir / "pipeline.html").write_text(render_pipeline(doc, path.stem), encoding="utf-8")
    print(pipe.table())
    # One frame through the pipeline with the chosen executor, against the single-board model.
    if calib is not None:
        from .quant.calib_data import calibration_batches

        first = dict(zip([s.name for s in model.inputs], calibration_batches(calib, model.inputs)[0]))
    else:
        rng = np.random.default_rng(0)
        first = {s.name: rng.standard_normal(s.shape).astype(np.float32) for s in model.inputs}
    with pipe:
        got = pipe.run(first)
    want = model.run(first)
    same = len(got) == len(want) and all(np.array_equal(a, b) for a, b in zip(got, want))
    print(f"check ({args.executor} executor): pipelined output "
          f"{'bit-identical to' if same else 'DIFFERS from'} the single-board run")
    print(f"wrote {len(pipe.stages)} stage artifacts, {doc_path} and {outdir / 'pipeline.html'}")
    return EXIT_OK if same else 1



# ---------------------------------------------------------------------------------------------------------
# dse
# ---------------------------------------------------------------------------------------------------------
def _numbers(text: str, flag: str, kind: type = float) -> list:
    """A comma-separated list of positive numbers given to `flag`, or one clear error."""
    try:
        vals = [kind(c) for c in text.split(",") if c.strip()]
    except ValueError:
        raise FrontendError(f"{flag} {text!r}: expected numbers separated by commas") from None
    if not vals or any(not 0 < v < float("inf") for v in vals):
        raise FrontendError(f"{flag} {text!r}: expected positive numbers")
    return vals


def _run_dse_card(args: argparse.Namespace, path: Path) -> int:
    """dse on a fixed-bitstream Alveo card: its overlays x engines x batch (pipeline/dse_card.py)."""
    import json

    from .pipeline.dse_card import card_summary, card_table, explore_card

    given = [f for f, v in (("--dsp", args.dsp), ("--bram", args.bram), ("--lut", args.lut),
                            ("--ddr-gbps", args.ddr_gbps)) if v is not None]
    if given or args.dsp_usage != "high":
        raise FrontendError(f"{', '.join(given) or '--dsp-usage'} with --part {args.part}: an Alveo card's DPU is a "
                            "fixed overlay (no budget to fit), dse chooses its overlay, engines and batch")
    clocks = None if args.clock_mhz == "300" else _numbers(args.clock_mhz, "--clock-mhz")
    batches = _numbers(args.batch, "--batch", int) if args.batch else None
    shapes = parse_input_shapes(args.input_shape)
    def build(overlay: str):
        return _build_reporting_warnings(str(path), arch=overlay, calibration=args.calib,
                                         shapes=shapes and dict(shapes), progress=not args.quiet)

    cands, skipped = explore_card(args.part, build, batches, clocks)
    print(card_summary(args.part))
    for ov, why in skipped.items():
        print(f"{ov}: not ranked ({why})")
    print(card_table(cands, args.top))
    if args.json:
        Path(args.json).write_text(json.dumps([c.to_json() for c in cands], indent=2) + "\n")
        print(f"wrote {args.json}")
    return EXIT_OK


def _run_dse(args: argparse.Namespace) -> int:
    import json
    import math

    from .pipeline.dse import algorithm1, device_budget, explore, table_text
    from .pipeline.dse_card import is_card

    path = _input_file(args.model)
    if args.part and is_card(args.part):
        return _run_dse_card(args, path)
    if args.batch:
        raise FrontendError("--batch applies to an Alveo card (--part u50 / u50lv / u280): a DPUCZDX8G core runs "
                            "one frame at a time")
    budget = device_budget(args.part) if args.part else {}
    dsp = args.dsp if args.dsp is not None else budget.get("dsp")
    bram = args.bram if args.bram is not None else budget.get("bram36k")
    lut = args.lut if args.lut is not None else budget.get("lut")
    if dsp is None or bram is None:
        raise FrontendError("give the board's budget: --dsp N --bram N (BRAM36K blocks), or --part PART")
    clocks = _numbers(args.clock_mhz, "--clock-mhz")
    for flag, v in (("--dsp", args.dsp), ("--bram", args.bram), ("--lut", args.lut), ("--ddr-gbps", args.ddr_gbps)):
        if v is not None and not 0 < v < math.inf:
            raise FrontendError(f"{flag} {v}: expected a positive number")
    if args.part and args.dsp is None and args.bram is None and args.lut is None:
        ignored = [f for f, given in (("--ddr-gbps", args.ddr_gbps is not None),
                                      ("--clock-mhz", args.clock_mhz != "300"),
                                      ("--dsp-usage", args.dsp_usage != "high")) if given]
        if ignored:
            raise FrontendError(f"{', '.join(ignored)} with --part alone: the part is explored as its board builds it "
                                "(its DDR bandwidth, clock and DSP usage); give --dsp/--bram (the part's budget "
                                "otherwise) to choose them")
    model = _build_reporting_warnings(str(path), arch="B4096", calibration=args.calib,
                                      shapes=parse_input_shapes(args.input_shape), progress=not args.quiet)
    if args.part and args.dsp is None and args.bram is None and args.lut is None:
        # a part alone: explore it as AMD's boards build it (platform reserve, URAM, its board's DDR and clock)
        from .pipeline.dse import explore_part, part_conditions

        cond = part_conditions(args.part)
        cands = explore_part(model, args.part, args.max_cores)
        b = cond["budget"]
        print(f"{args.part} as its board ({cond['board']}) builds it: {b['dsp']:.0f} DSP, {b['bram36k']:.0f} "
              f"BRAM36K, {b['lut']:.0f} LUT, {b['uram']:.0f} URAM after the platform reserve; "
              f"{cond['clock_mhz']:g} MHz, DDR {cond['ddr_bytes_per_s'] / 1e9:g} GB/s; {len(cands)} configurations "
              f"fit; Algorithm 1 (DSP only) would pick {algorithm1(int(dsp))}")
    else:
        cands = explore(model, int(dsp), float(bram), None if lut is None else int(lut), clocks, args.max_cores,
                        args.dsp_usage, args.ddr_gbps * 1e9 / 8 if args.ddr_gbps else 17.1e9)
        print(f"budget: {dsp} DSP, {bram} BRAM36K{'' if lut is None else f', {lut} LUT'}; "
              f"{len(cands)} configurations fit; Algorithm 1 (DSP only) would pick {algorithm1(int(dsp))}")
    print(table_text(cands, args.top))
    if args.json:
        Path(args.json).write_text(json.dumps([c.to_json() for c in cands], indent=2) + "\n")
        print(f"wrote {args.json}")
    return EXIT_OK




def _run_compare(args) -> int:
    from tvm_dpu.xmodel.compare import compare

    result = compare(args.xmodel, seed=args.seed, inputs=args.inputs)
    print(result.table())
    if args.json:
        import json

        Path(args.json).write_text(json.dumps(result.to_dict(), indent=1) + "\n")
        print(f"wrote {args.json}")
    return 0 if result.subgraphs else 1  # nothing could be compared: the table says why


# ---------------------------------------------------------------------------------------------------------
# benchmark
# ---------------------------------------------------------------------------------------------------------
def _load_to_run(path: str, args: argparse.Namespace):
    """A .tvmdpu artifact or .xmodel loaded for the device and trust options of `args` (run, benchmark)."""
    if args.device == "pynq" and not args.bitfile:
        raise FrontendError("--device pynq needs --bitfile (the DPU bitstream, e.g. dpu.bit)")
    options = {"bitfile": args.bitfile, "timeout_s": args.timeout} if args.device == "pynq" else {}
    if _is_xmodel(path):
        from .xmodel.runner import load_xmodel

        if args.require_signature:
            raise FrontendError("--require-signature does not apply to an .xmodel (vai_c's files are not signed)")
        return load_xmodel(path, device=args.device, **options)
    from .runtime.artifact import load

    return load(path, device=args.device, trusted_keys=args.require_signature, trust=_trust(args), **options)


def _run_benchmark(args: argparse.Namespace) -> int:
    import json

    from .serving.benchmark import benchmark

    if args.warmup < 0:
        raise FrontendError(f"--warmup {args.warmup}: expected 0 or more")
    model = _load_to_run(args.model, args)
    feeds = _feeds_for(model, args.input, "--input") if args.input else None
    result = benchmark(model, threads=args.threads, runs=args.runs, warmup=args.warmup, inputs=feeds,
                       device=args.device)
    arch = getattr(model, "arch", None)
    print(f"{args.model}: {getattr(arch, 'name', 'no DPU subgraph')}")
    print(result.table())
    if args.json:
        Path(args.json).write_text(json.dumps(result.to_json(), indent=2) + "\n")
        print(f"wrote {args.json}")
    return EXIT_OK


# ---------------------------------------------------------------------------------------------------------
# The command table: every subcommand's parser is data (options shared by several commands are defined once)
# ---------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Arg:
    """One `add_argument` call: its flags and keywords. A callable ``choices`` is called when the parser is
    built (it may import the module that defines the names)."""

    flags: tuple[str, ...]
    kwargs: dict

    def add_to(self, parser: argparse.ArgumentParser) -> None:
        kw = dict(self.kwargs)
        if callable(kw.get("choices")):
            kw["choices"] = kw["choices"]()
        parser.add_argument(*self.flags, **kw)


def arg(*flags: str, **kwargs) -> Arg:
    return Arg(flags, kwargs)


@dataclass(frozen=True)
class Command:
    """A subcommand: its name, one-line help, description, arguments and the function running it."""

    name: str
    run: Callable[[argparse.Namespace], int]
    help: str
    description: str
    args: tuple[Arg, ...]


def _device_choices() -> list[str]:
    from .runtime.device_kinds import DEVICE_KINDS

    return list(DEVICE_KINDS)


MODEL = arg("model", metavar="MODEL.onnx", help="the ONNX model to read")
ARCH = arg("--arch", required=True, metavar="ARCH",
           help="DPU target: a preset name (e.g. DPUCZDX8G_ISA1_B4096, B1152, zcu102, kv260, dnnvm-zu2) or the "
           'path of an arch.json holding {"target": NAME} or {"fingerprint": "0x..."}')
INPUT_SHAPE = arg("--input-shape", action="append", default=[], metavar="NAME=D1,D2,...",
                  help="static shape of model input NAME, e.g. input=1,3,224,224 (repeat for several inputs; needed "
                  "for inputs with symbolic or unknown dimensions)")
#: What --calib takes, said in its help and in every error about it.
CALIB_ACCEPTS = ("--calib takes one .npz file (numpy.savez) whose arrays are named like the model inputs, each with "
                 "a leading sample axis (N, ...)")
CALIB = arg("--calib", metavar="FILE.npz",
            help="calibration data: one .npz file (numpy.savez, not a folder of images) whose arrays are named like "
            "the model inputs with a leading sample axis (N, ...; batch-1 samples are grouped into the model's "
            "batch); without it the model is calibrated on random inputs (a warning says so), except a QDQ model "
            "whose every tensor has its scale in the file, which needs no calibration")
REQUANTIZE = arg("--requantize", action="store_true",
                 help="for a QDQ model whose scales are not powers of two (onnxruntime-style): strip its Q/DQ pairs "
                 "and calibrate the float model instead of rounding the scales to powers of two")
FUSION = arg("--fusion", choices=["none", "greedy", "optimal"], default="optimal",
             help="DNNVM kernel fusion: none (every op alone; concat inputs saved into their slice, as the unfused "
             "compiler does), greedy (first template match wins) or optimal (execution-path search over all template "
             "matches; default)")
QUIET = arg("-q", "--quiet", action="store_true", help="no progress bar")
OUTDIR = arg("-o", "--output", required=True, metavar="OUTDIR", help="output directory (created)")
RUN_INPUT = arg("--input", metavar="FILE.npz", action="append",
                help="input arrays named like the model inputs (default: random normal input); with several "
                "artifacts, once per artifact in the same order")
DEVICE = arg("--device", choices=_device_choices, default="emulator",
             help="where the DPU subgraphs run: the bit-exact emulator (default) or the DPU of a Pynq board (needs "
             "the pynq package: pip install 'tvm-dpu[pynq]')")
BITFILE = arg("--bitfile", metavar="DPU.bit", help="with --device pynq: the DPUCZDX8G bitstream to load")
TIMEOUT = arg("--timeout", type=float, default=5.0, metavar="SECONDS",
              help="with --device pynq: give up on a DPU run after this many seconds (default 5)")
REQUIRE_SIGNATURE = arg("--require-signature", metavar="PUBKEY", action="append",
                        help="refuse the artifact unless it is signed by this Ed25519 public key (PEM or raw 32 "
                        "bytes; repeat for several trusted keys); checked before anything in the file is used")
ALLOW_UNSIGNED = arg("--allow-unsigned", action="store_true",
                     help="load the native code of an artifact that is neither signed by a trusted key nor built by "
                     "you on this machine (you vouch for the file; see docs/deploy.md, trust policy)")
ARTIFACT = arg("artifact", metavar="ARTIFACT", help="a .tvmdpu file written by 'tvm-dpu compile', or a vai_c .xmodel")
#: Where and how a compiled model is loaded to run (run, benchmark).
LOADING = (DEVICE, BITFILE, TIMEOUT, REQUIRE_SIGNATURE, ALLOW_UNSIGNED)

COMMAND_LIST: tuple[Command, ...] = (
    Command(
        "partition", _run_partition,
        "show which nodes of a model run on the DPU and why the others stay on the CPU",
        "Import MODEL.onnx, partition it for the DPU ARCH and print one row per ONNX node: device (dpu/cpu), DPU "
        "subgraph id, and for CPU nodes the exact limit or rule that keeps them there.",
        (MODEL, ARCH, INPUT_SHAPE, REQUANTIZE,
         arg("--json", metavar="FILE",
             help='also write the report as JSON: {"arch", "nodes": [{"name","op","device","subgraph","reason"}], '
             '"subgraphs"}'))),
    Command(
        "compile", _run_compile,
        "compile an ONNX model: DPU machine code for the DPU parts, LLVM for the rest, one artifact",
        "Import MODEL.onnx, partition it for ARCH, calibrate and quantize every DPU subgraph (power-of-two int8), "
        "emit DPU machine code, compile the CPU remainder with TVM/LLVM and write OUTDIR/NAME.tvmdpu (the "
        "artifact), OUTDIR/meta.json (arch, inputs/outputs, per subgraph its tensors with shapes and fix_points) "
        "and OUTDIR/report.json (partition, instruction counts, DDR footprint).",
        (MODEL, ARCH, INPUT_SHAPE, OUTDIR,
         arg("-n", "--name", metavar="NAME", help="artifact name (default: the model file's stem)"),
         CALIB, REQUANTIZE,
         arg("--options", metavar="JSON",
             help='vai_c-style options: \'{"input_shape": "1,3,224,224", "output_ops": "fc1,fc2", "plugins": '
             '"softmax_ip"}\'. input_shape sets the first input\'s shape (several inputs: "1,3,224,224;1,10" in '
             "input order; --input-shape takes precedence); output_ops cuts the model at these ONNX node or tensor "
             "names"),
         arg("--cross", choices=["aarch64"],
             help="also put the CPU part cross-compiled for aarch64 Linux (the board) in the artifact; needs "
             "aarch64-linux-gnu-gcc (Debian: apt-get install gcc-aarch64-linux-gnu)"),
         arg("--sign", metavar="KEYFILE",
             help="sign the artifact with this Ed25519 private key ('tvm-dpu keygen' makes one): the signature "
             "covers every byte, CPU library included"),
         arg("--png", action="store_true",
             help="also draw each DPU subgraph's engine timeline as a PNG Gantt chart (matplotlib; the Chrome "
             "traces, always written, hold the same data)"),
         arg("--format", choices=["tvmdpu", "xmodel"], default="tvmdpu",
             help="xmodel: also write <name>.xmodel, AMD's XIR graph for VART / PYNQ-DPU (docs/deploy.md)"),
         arg("--no-verify-data", action="store_true",
             help="leave out the quantized XGraphs that only 'tvm-dpu run --verify' needs (they repeat the "
             "weights: the artifact shrinks by about half)"),
         FUSION,
         arg("--cores", type=positive_int, default=1, metavar="N",
             help="schedule independent DPU work of each subgraph (Inception branches, shortcut convs) on N cores "
             "of the device (at most the arch's core count, e.g. 3 on zcu102); report.json gives the predicted "
             "latency on 1 and N cores and OUTDIR/NAME.sgK.cores.trace.json the per-core timeline"),
         arg("--segments", choices=["auto", "always"], default="auto",
             help="with --cores: keep a subgraph's segments only when predicted faster than one program on one "
             "core (auto, default) or always"),
         arg("-q", "--quiet", action="store_true", help="print only the subgraph summary, no progress bar"))),
    Command(
        "run", _run_run,
        "run a compiled artifact: CPU part in TVM, DPU subgraphs on the emulator (or a Pynq board)",
        "Load NAME.tvmdpu and run it once. With --verify the golden reference runs beside every DPU subgraph and "
        "the exit code is 1 when any element differs.",
        (arg("compiled", metavar="COMPILED", nargs="+",
             help="the .tvmdpu artifact written by 'tvm-dpu compile', or the pipeline.json (or its directory) "
             "written by 'tvm-dpu pipeline'; several artifacts run at the same time on the cores of one device "
             "(placed on --cores cores by predicted DPU load) and throughput per model and per core is printed"),
         RUN_INPUT,
         arg("--cores", type=positive_int, metavar="N",
             help="one artifact: run its DPU subgraphs on N emulated cores (segments of a model compiled with "
             "--cores run concurrently); several artifacts: share N cores (default: one core per artifact, up to "
             "the arch's core count)"),
         arg("--runs", type=positive_int, default=1, metavar="R", help="run each model R times (default 1)"),
         arg("--executor", choices=["local", "ray"], default="local",
             help="for a pipeline: run the stages on threads here (default) or as Ray actors, one per board (pip "
             "install 'tvm-dpu[cluster]'; joins the cluster of RAY_ADDRESS, else starts a local one)"),
         arg("--verify", action="store_true",
             help="compare every DPU subgraph with the golden reference; exit 1 on any mismatch"),
         arg("-o", "--output", metavar="OUT.npz", help="save the outputs under the model's output names"),
         arg("--min-release", metavar="VERSION",
             help="for a pipeline: refuse a release older than VERSION (pipeline.json's signed release version; "
             "an older signed release would otherwise run)"),
         *LOADING)),
    Command(
        "benchmark", _run_benchmark,
        "measure throughput and latency of a compiled model (like xdputil benchmark), beside the timing model",
        "Load MODEL (a .tvmdpu artifact or a vai_c .xmodel), run it --runs times from each of --threads threads "
        "through the VART-style runner (tvm_dpu.serving.runner) and print throughput, latency percentiles (p50/p90/p99) "
        "and the time spent per DPU subgraph and per CPU part, beside the timing model's predicted DPU latency.",
        (arg("model", metavar="MODEL", help="a .tvmdpu artifact or a vai_c-compiled .xmodel"),
         arg("--threads", type=positive_int, default=1, metavar="N", help="threads submitting jobs (default 1)"),
         arg("--runs", type=positive_int, default=10, metavar="R", help="jobs per thread (default 10)"),
         arg("--warmup", type=int, default=1, metavar="W", help="untimed jobs first (default 1)"),
         arg("--input", metavar="FILE.npz", help="input arrays named like the model inputs (default: random)"),
         arg("--json", metavar="FILE.json", help="also write the figures as JSON"),
         *LOADING)),
    Command(
        "inspect", _run_inspect,
        "show what an artifact holds: arch, inputs/outputs, DPU subgraphs with fix_points, instructions",
        "Read ARTIFACT (checksums verified; nothing in it is executed) and print its arch and fingerprint, model "
        "inputs and outputs, and every DPU subgraph: tensors with shapes, fix_points and DDR places, instruction "
        "counts, code and parameter sizes.",
        (ARTIFACT,
         arg("--disasm", action="store_true", help="also print the instruction listing of every subgraph"),
         arg("--json", action="store_true", help="print JSON (the meta.json content plus section sizes; with "
             "--disasm a 'listing' per subgraph) instead of text"),
         arg("--check-deps", action="store_true", help="check every DPU program's dpdon/dpdby tokens and races "
             "(docs/dependency-protocol.md) instead; exit 2 if any program breaks the protocol"),
         arg("--check-vart", action="store_true", help="(.xmodel) check every DPU subgraph against the reads AMD's "
             "VART runner makes of it (regions, mc_code, fingerprint, each tensor's reg_id/ddr_addr/location, "
             "...; docs/deploy.md) instead; with --json the findings as JSON; exit 1 if any rule is broken"),
         arg("--check-xir", action="store_true", help="(.xmodel) load it with AMD's XIR library (libxir-dev) and "
             "re-run XIR's shape inference on every op instead (with --check-vart: both); exit 1 if XIR refuses "
             "it or infers another shape than the file's, 2 if XIR or g++ is not installed"))),
    Command(
        "report", _run_report,
        "write a self-contained HTML report of an artifact (partition graph, cycles, engine timeline)",
        "Read ARTIFACT and write one HTML file (no external resources): the partitioned graph with DPU and CPU "
        "nodes coloured, a table per DPU subgraph (instructions, DDR, fix_points) with its simulated cycles, and "
        "the engine timeline (LOAD/SAVE/CONV/MISC) of each subgraph from the timing model.",
        (ARTIFACT, arg("-o", "--output", required=True, metavar="REPORT.html", help="the HTML file to write"),
         arg("--board", metavar="BOARD", help="(.xmodel) time the DPU programs on this board preset's clock and "
             "memory (e.g. u50lv for a DPUCAHX8H_ISA2 program; it must carry the xmodel's DPU) instead of the bare "
             "core's"))),
    Command(
        "keygen", _run_keygen, "make an Ed25519 key pair for signing artifacts",
        "Write PREFIX.key (private key, PEM, mode 0600) and PREFIX.pub (public key, PEM).",
        (arg("prefix", metavar="PREFIX", help="path prefix of the two key files"),
         arg("--force", action="store_true", help="replace existing key files (default: refuse)"))),
    Command(
        "pipeline", _run_pipeline,
        "split a model over N boards (balanced stages, one artifact per board) and check it runs",
        "Compile MODEL.onnx, cut it into --boards stages at op granularity minimising the slowest stage (timing "
        "model + link model), compile each stage for its board and write OUTDIR/stage<i>.tvmdpu, "
        "OUTDIR/pipeline.json and OUTDIR/pipeline.html. Run it with 'tvm-dpu run OUTDIR/pipeline.json'.",
        (MODEL,
         arg("--arch", metavar="ARCH[,ARCH...]",
             help="each board's DPU: one preset for every board (e.g. zcu102, ultra96, dnnvm-zu2) or one per "
             "board, comma-separated (boards may differ)"),
         arg("--part", metavar="PART[,PART...]",
             help="instead of --arch: each board's FPGA part (zu2eg, zu3eg, zu5ev, zu7ev, zu9eg); its DPU is "
             "picked by design-space exploration ('tvm-dpu dse'); DDR per board from --ddr-mib (default 2048)"),
         arg("--boards", type=positive_int, required=True, metavar="N", help="number of boards (pipeline stages)"),
         CALIB,
         arg("--link", default=None, metavar="LINK",
             help="link model between boards: serial-8.5g (the PYNQ-cluster paper's links; the default with the "
             "local executor), gbe, or ray-gbe (Ray's object store over GbE; the default with --executor ray)"),
         arg("--executor", choices=["local", "ray"], default="local",
             help="executor of the check run: threads here (default) or Ray actors"),
         arg("--ddr-mib", type=int, metavar="MiB",
             help="usable DDR per board (default: from the board preset; needed for a bare DPU config)"),
         FUSION, INPUT_SHAPE,
         arg("--sign", metavar="KEYFILE", help="sign every stage artifact and the manifest (pipeline.sig) with "
             "this Ed25519 private key"),
         arg("--release", default="0", metavar="VERSION",
             help="release version recorded (with the build time) in pipeline.json, under its signature; "
             "'tvm-dpu run --min-release' refuses older ones (default 0)"),
         OUTDIR, QUIET)),
    Command(
        "dse", _run_dse,
        "rank the DPU configurations (B512..B4096, cores, clock) that fit a board's DSP/BRAM budget",
        "Design-space exploration (the PYNQ-cluster paper's Algorithm 1, generalised): every DPUCZDX8G "
        "configuration whose PG338 resource cost fits the budget, ranked by the predicted throughput of MODEL "
        "(timing model, DDR-capped).",
        (MODEL,
         arg("--dsp", type=int, metavar="N", help="DSP48 slices available for the DPU"),
         arg("--bram", type=float, metavar="N", help="BRAM36K blocks available for the DPU"),
         arg("--lut", type=int, metavar="N", help="LUTs available for the DPU (default: not checked)"),
         arg("--part", metavar="PART", help="a Zynq UltraScale+ part (zu2eg, zu3eg, zu5ev, zu7ev, zu9eg): alone, "
             "explored as its board builds it (platform reserve, UltraRAM, the board's DDR and clock); with "
             "--dsp/--bram/--lut, its budget overridden by them. Or an Alveo card (u50, u50lv, u280): its fixed "
             "DPUCAHX8H overlays ranked by overlay (ISA2 / DWC), engines used and batch"),
         arg("--batch", metavar="N[,N...]", help="for an Alveo card: frames sent at once (default 1 and the "
             "overlay's engine count)"),
         arg("--clock-mhz", default="300", metavar="MHZ[,MHZ...]", help="DPU clocks to try (default 300)"),
         arg("--max-cores", type=positive_int, default=4, metavar="N", help="most cores to try (PG338: up to 4)"),
         arg("--dsp-usage", choices=["high", "low"], default="high", help="PG338 DSP usage option"),
         arg("--ddr-gbps", type=float, metavar="GBIT/S", help="board DDR bandwidth (default 136.8 = 17.1 GB/s)"),
         CALIB, INPUT_SHAPE,
         arg("--top", type=positive_int, default=20, metavar="N", help="rows to print (default 20)"),
         arg("--json", metavar="FILE.json", help="also write every candidate as JSON"),
         QUIET)),
    Command(
        "compare", _run_compare, "vai_c's program beside tvm-dpu's for an xmodel's quantized network",
        "Rebuild each DPU subgraph of a vai_c .xmodel as a QDQ ONNX model (its int8 constants, scales "
        "2^-fix_point), compile it with tvm-dpu and run both programs on the emulator on the same random inputs: "
        "int8 output differences, instructions per engine, DDR bytes and timing-model cycles "
        "(tvm_dpu.xmodel.compare). Outputs that are all zero or the same for every input tried get a warning "
        "(equality proves nothing there); intermediate maps vai_c's program leaves in DDR, or computes in "
        "per-layer programs (debug mode), are compared layer by layer with tvm-dpu's golden reference.",
        (arg("xmodel", help="a vai_c-compiled .xmodel"),
         arg("--seed", type=int, default=0, help="seed of the random int8 inputs (default 0)"),
         arg("--inputs", type=positive_int, default=3, metavar="N",
             help="random int8 inputs per subgraph (default 3)"),
         arg("--json", metavar="FILE.json", help="also write the comparison (warnings and layers included) as "
             "JSON"))),
)

#: Subcommand name -> its Command.
COMMANDS: dict[str, Command] = {c.name: c for c in COMMAND_LIST}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Compile CNNs for AMD/Xilinx DPUs (DPUCZDX8G ISA1; DPUCAHX8H, Alveo U50/U280) through TVM Relax. Run "
        f"'{PROG} COMMAND --help' for the options of a command.",
    )
    parser.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    parser.subcommand_parsers = {}  # type: ignore[attr-defined]  # for errors found after parsing
    for cmd in COMMANDS.values():
        p = sub.add_parser(cmd.name, help=cmd.help, description=cmd.description)
        parser.subcommand_parsers[cmd.name] = p  # type: ignore[attr-defined]
        for a in cmd.args:
            a.add_to(p)
        p.set_defaults(func=cmd.run)
    return parser


#: Generation-0 threshold of CPython's cyclic collector while a command runs (CPython's default: 700).
GC_GEN0_THRESHOLD = 10_000
_exit_freeze_registered = False


@contextmanager
def collector_for_a_command() -> Iterator[None]:
    """Run a command with the cyclic collector triggered less often, and skip its scans when the process ends.

    A compile keeps a few hundred thousand objects alive (TVM's registries, the graph, caches) while it allocates
    millions that die young; with CPython's default thresholds every tenth generation-1 collection may become a
    full scan of everything alive (ResNet-50: 12 full collections, about 1 s of CPU; with generation 0 at 10,000,
    one). Collections still run, so cyclic garbage is still freed. At interpreter exit the heap is frozen
    (`gc.freeze`, from an atexit handler): objects are still released by reference counting, but the collections
    the interpreter makes while tearing modules down no longer scan them (after a ResNet-50 compile run as the
    console script: 0.17 -> 0.11 s from the last output to exit_group). The previous thresholds are restored when
    the command returns (commands also run in-process, from tests)."""
    global _exit_freeze_registered
    if not _exit_freeze_registered:
        atexit.register(gc.freeze)
        _exit_freeze_registered = True
    before = gc.get_threshold()
    gc.set_threshold(max(GC_GEN0_THRESHOLD, before[0]), *before[1:])
    try:
        yield
    finally:
        gc.set_threshold(*before)


def _parse(parser: argparse.ArgumentParser, argv: Sequence[str] | None) -> argparse.Namespace:
    """parse_args, with a suggestion for a mistyped command or option (argparse before Python 3.14 gives none)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    command = next((a for a in argv if not a.startswith("-")), None)
    if command is not None and command not in COMMANDS:
        parser.error(f"argument COMMAND: invalid choice: {command!r}{did_you_mean(command, list(COMMANDS))} "
                     f"(choose from {', '.join(COMMANDS)})")
    args, extra = parser.parse_known_args(argv)
    if extra:
        flags = [f for a in COMMANDS[args.command].args for f in a.flags if f.startswith("-")] + ["--help"]
        hints = [h for h in (did_you_mean(x.split("=", 1)[0], flags) for x in extra if x.startswith("-")) if h]
        sub = parser.subcommand_parsers[args.command]  # type: ignore[attr-defined]
        sub.error(f"unrecognized arguments: {' '.join(extra)}{''.join(hints)}")
    return args


def _existing(path: str, what: str = "") -> Path:
    p = Path(path)
    if not p.exists():
        raise FrontendError(f"{what}{p}: no such file")
    return p


def preflight(args: argparse.Namespace) -> None:
    """The checks of a command's arguments that need no heavy import (TVM, onnx: seconds each), made before the
    command runs so that a mistake is reported at once: files that must exist, .npz files, the arch name, and a
    compile's input names and shapes against the ONNX file's declared inputs."""
    from .serving.feeds import npz_file

    cmd = args.command
    for attr in ("compiled", "artifact", "xmodel") + (("model",) if cmd == "benchmark" else ()):
        value = getattr(args, attr, None)
        for p in [value] if isinstance(value, str) else value or []:
            _existing(p)
    inputs = getattr(args, "input", None)
    for p in [inputs] if isinstance(inputs, str) else inputs or []:
        npz_file(p, "--input", "--input takes an .npz file (numpy.savez) of arrays named like the model inputs")
    if getattr(args, "calib", None):
        npz_file(args.calib, "--calib", CALIB_ACCEPTS)
    if cmd not in ("compile", "partition", "pipeline", "dse"):
        return
    from .onnx_inputs import checked_shapes, read_inputs

    graph_inputs = read_inputs(args.model)
    if cmd in ("compile", "partition"):
        from .arch import load_arch

        load_arch(args.arch)
    if cmd in ("compile", "pipeline"):  # the export links with it: said now, not after the whole build
        from .util.toolchains import c_compiler, host_machine

        c_compiler(host_machine())
    shapes = parse_input_shapes(getattr(args, "input_shape", None)) or {}
    opt_shapes, output_ops = parse_vai_options(getattr(args, "options", None), [i.name for i in graph_inputs])
    for k, v in opt_shapes.items():
        shapes.setdefault(k, v)
    if not output_ops:  # a cut model may drop inputs: checked after the cut
        checked_shapes(graph_inputs, shapes, args.model)


#: log2 of the cycles an idle OpenBLAS worker thread spins before it sleeps, for the commands' process (OpenBLAS's
#: default, 28, is about 0.1 s at 2.6 GHz; 20 is 0.4 ms).
BLAS_THREAD_TIMEOUT = "20"


def _short_blas_spin() -> None:
    """Let OpenBLAS's idle workers sleep after 2**BLAS_THREAD_TIMEOUT cycles instead of spinning for about 0.1 s
    (unless the user set OPENBLAS_THREAD_TIMEOUT). Calibration alternates its float64 products with single-threaded
    numpy work and its statistics threads; with the default spin the worker held a core through the whole run
    (ResNet-50 on 2 cores at load 8-11: calibration 3.6-4.3 CPU-s, 3.1-3.3 with this; no result changes). OpenBLAS
    reads the variable when numpy loads it (there is no call to change it later), so it is set only before anything
    imported numpy. (How many threads the products use is set at run time: util.blas.)"""
    import os

    if "numpy" not in sys.modules:
        os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", BLAS_THREAD_TIMEOUT)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `tvm-dpu` console script; returns the exit code."""
    _short_blas_spin()
    parser = build_parser()
    args = _parse(parser, argv)
    try:
        with collector_for_a_command():
            preflight(args)
            return int(args.func(args))
    except DPUError as err:
        print(f"{PROG}: error: {_one_line(err)}", file=sys.stderr)
        return EXIT_USER_ERROR
    except OSError as err:  # e.g. the --json path is not writable
        print(f"{PROG}: error: {_one_line(err)}", file=sys.stderr)
        return EXIT_USER_ERROR


def _one_line(err: BaseException) -> str:
    return " ".join(str(err).split()) or type(err).__name__


if __name__ == "__main__":
    sys.exit(main())
