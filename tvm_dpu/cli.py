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


# Subcommand name -> function adding its parser to the subparsers object. Later issues add compile, run,
# inspect and report here.
COMMANDS: dict[str, Callable] = {
    "partition": _add_partition,
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
