"""The `tvm-dpu` command line (like vai_c): one subcommand per task.

Subcommands register themselves in `COMMANDS` (name -> function adding its parser); each parser sets
``func`` to the function running it, which returns the exit code. Errors raised on purpose by tvm-dpu
(`tvm_dpu.errors.DPUError`: bad arch, bad model, bad shape, ...) and OS errors on user paths are printed as
one line ``tvm-dpu: error: ...`` on stderr with exit code 2 (user error), without a traceback. Heavy imports
(TVM) happen inside the subcommands so that ``--help`` stays fast.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Callable, Sequence

from . import __version__
from .errors import DPUError, FrontendError

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


def _add_model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", metavar="MODEL.onnx", help="the ONNX model to read")
    p.add_argument(
        "--arch",
        required=True,
        metavar="ARCH",
        help="DPU target: a preset name (e.g. DPUCZDX8G_ISA1_B4096, B1152, zcu102, kv260, dnnvm-zu2) or the "
        'path of an arch.json holding {"target": NAME} or {"fingerprint": "0x..."}',
    )
    p.add_argument(
        "--input-shape",
        action="append",
        default=[],
        metavar="NAME=D1,D2,...",
        help="static shape of model input NAME, e.g. input=1,3,224,224 (repeat for several inputs; needed for "
        "inputs with symbolic or unknown dimensions)",
    )


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
    from .frontend import from_onnx

    return arch, from_onnx(str(path), shapes)


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


def _add_partition(sub) -> None:
    p = sub.add_parser(
        "partition",
        help="show which nodes of a model run on the DPU and why the others stay on the CPU",
        description="Import MODEL.onnx, partition it for the DPU ARCH and print one row per ONNX node: device "
        "(dpu/cpu), DPU subgraph id, and for CPU nodes the exact limit or rule that keeps them there.",
    )
    _add_model_args(p)
    p.add_argument(
        "--json",
        metavar="FILE",
        help='also write the report as JSON: {"arch", "nodes": [{"name","op","device","subgraph","reason"}], '
        '"subgraphs"}',
    )
    p.set_defaults(func=_run_partition)


# ---------------------------------------------------------------------------------------------------------
# compile
# ---------------------------------------------------------------------------------------------------------
def _run_compile(args: argparse.Namespace) -> int:
    import json
    import warnings

    from .arch import load_arch
    from .builder import build
    from .runtime.artifact import SUFFIX, export

    arch = load_arch(args.arch)
    shapes = parse_input_shapes(args.input_shape)
    path = Path(args.model)
    if not path.is_file():
        raise FrontendError(f"{path}: no such file")
    name = args.name or path.stem
    outdir = Path(args.output)
    outdir.mkdir(parents=True, exist_ok=True)
    calib = None
    if args.calib:
        calib = Path(args.calib)
        if not calib.is_file():
            raise FrontendError(f"--calib {calib}: no such file")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model = build(str(path), arch=arch, calibration=calib, shapes=shapes, progress=not args.quiet)
    for w in caught:
        print(f"{PROG}: warning: {w.message}", file=sys.stderr)
    artifact = export(model, outdir / f"{name}{SUFFIX}")
    report = model.report()
    (outdir / "report.json").write_text(json.dumps(report, indent=2) + "\n")
    if not args.quiet:
        print(model.partition_report.table())
        print()
    print(_subgraph_table(report))
    print(f"wrote {artifact} ({artifact.stat().st_size} bytes) and {outdir / 'report.json'}")
    return EXIT_OK


def _subgraph_table(report: dict) -> str:
    rows = [("subgraph", "ops", "instructions", "CONV", "ALU", "ELEW", "LOAD", "SAVE", "DDR bytes")]
    for s in report["subgraphs"]:
        c = s["instruction_counts"]
        rows.append((str(s["id"]), str(s["ops"]), str(s["instructions"]), str(c.get("CONV", 0)), str(c.get("ALU", 0)),
                     str(c.get("ELEW", 0)), str(c.get("LOAD", 0)), str(c.get("SAVE", 0)),
                     str(sum(s["ddr_bytes"].values()))))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(cell.rjust(w) for cell, w in zip(r, widths)) for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    lines.append(f"{len(report['subgraphs'])} DPU subgraph(s) for {report['dpu']} ({report['arch']}), "
                 f"DDR {report['ddr_total_bytes']} bytes")
    return "\n".join(lines)


def _add_compile(sub) -> None:
    p = sub.add_parser(
        "compile",
        help="compile an ONNX model: DPU machine code for the DPU parts, LLVM for the rest, one artifact",
        description="Import MODEL.onnx, partition it for ARCH, calibrate and quantize every DPU subgraph "
        "(power-of-two int8), emit DPU machine code, compile the CPU remainder with TVM/LLVM and write "
        "OUTDIR/NAME.tvmdpu plus OUTDIR/report.json.",
    )
    _add_model_args(p)
    p.add_argument("-o", "--output", required=True, metavar="OUTDIR", help="output directory (created)")
    p.add_argument("-n", "--name", metavar="NAME", help="artifact name (default: the model file's stem)")
    p.add_argument("--calib", metavar="FILE.npz",
                   help="calibration data: arrays named like the model inputs with a leading sample axis (N, ...); "
                   "without it the model is calibrated on random inputs (a warning says so)")
    p.add_argument("-q", "--quiet", action="store_true", help="print only the subgraph summary, no progress bar")
    p.set_defaults(func=_run_compile)


# ---------------------------------------------------------------------------------------------------------
# run
# ---------------------------------------------------------------------------------------------------------
def _run_run(args: argparse.Namespace) -> int:
    import numpy as np

    from .runtime.artifact import load

    model = load(args.compiled)
    if args.input:
        with np.load(args.input, allow_pickle=False) as z:
            data = {k: z[k] for k in z.files}
        if len(model.inputs) == 1 and model.inputs[0].name not in data and len(data) == 1:
            data = {model.inputs[0].name: next(iter(data.values()))}
        missing = [s.name for s in model.inputs if s.name not in data]
        if missing:
            raise FrontendError(f"--input {args.input}: no array named {missing} (has {sorted(data)})")
        feeds = {s.name: data[s.name] for s in model.inputs}
    else:
        rng = np.random.default_rng(0)
        feeds = {s.name: rng.standard_normal(s.shape).astype(np.float32) for s in model.inputs}
        print("no --input: running on random normal input (seed 0)")
    for s in model.inputs:
        if tuple(np.shape(feeds[s.name])) != tuple(s.shape):
            raise FrontendError(f"input {s.name!r} has shape {np.shape(feeds[s.name])}, the model expects {s.shape}")
    model.set_verify(args.verify)
    outputs = model.run(feeds)
    for i, y in enumerate(outputs):
        flat = y.reshape(-1)
        top = ", ".join(f"{int(k)}:{flat[k]:.4f}" for k in np.argsort(-flat)[:5])
        print(f"output {i}: shape {tuple(y.shape)}, top-5 [{top}]")
    if args.output:
        np.savez(args.output, **{f"output_{i}": y for i, y in enumerate(outputs)})
        print(f"wrote {args.output}")
    if args.verify:
        results = model.verify_results()
        bad = sum(r.mismatches for r in results)
        print(f"verify: {len(results)} subgraphs, {bad} mismatching elements")
        for r in results:
            for note in r.first:
                print(f"  {r.subgraph}: {note}")
        return 1 if bad else EXIT_OK
    return EXIT_OK


def _add_run(sub) -> None:
    p = sub.add_parser(
        "run",
        help="run a compiled artifact: CPU part in TVM, DPU subgraphs on the emulator",
        description="Load NAME.tvmdpu and run it once. With --verify the golden reference runs beside every DPU "
        "subgraph and the exit code is 1 when any element differs.",
    )
    p.add_argument("compiled", metavar="COMPILED", help="the .tvmdpu artifact written by 'tvm-dpu compile'")
    p.add_argument("--input", metavar="FILE.npz",
                   help="input arrays named like the model inputs (default: random normal input)")
    p.add_argument("--verify", action="store_true",
                   help="compare every DPU subgraph with the golden reference; exit 1 on any mismatch")
    p.add_argument("-o", "--output", metavar="OUT.npz", help="save the outputs as output_0, output_1, ...")
    p.set_defaults(func=_run_run)


# Subcommand name -> function adding its parser to the subparsers object.
COMMANDS: dict[str, Callable] = {
    "partition": _add_partition,
    "compile": _add_compile,
    "run": _add_run,
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Compile CNNs for the Xilinx DPUCZDX8G (ISA1) through TVM Relax. Run "
        f"'{PROG} COMMAND --help' for the options of a command.",
    )
    parser.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for add in COMMANDS.values():
        add(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `tvm-dpu` console script; returns the exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
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
