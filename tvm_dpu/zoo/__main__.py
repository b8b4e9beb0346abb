"""``python -m tvm_dpu.zoo OUTDIR [--reduced] [--names NAME ...] [--seed N]``: write zoo models as ONNX files."""
from __future__ import annotations

import argparse
import sys

from . import MODELS, save_model


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tvm_dpu.zoo", description=__doc__.split(":", 1)[-1].strip())
    parser.add_argument("outdir", help="directory to write <name>.onnx (or <name>_small.onnx with --reduced) into")
    parser.add_argument("--reduced", action="store_true", help="small variants (64x64 input, channels / 8, 10 classes)")
    parser.add_argument("--names", nargs="+", choices=MODELS, default=list(MODELS), metavar="NAME",
                        help=f"models to write (default: all of {', '.join(MODELS)})")
    parser.add_argument("--seed", type=int, default=0, help="weight seed (default 0)")
    args = parser.parse_args(argv)
    suffix = "_small" if args.reduced else ""
    for name in args.names:
        path = save_model(name, f"{args.outdir}/{name}{suffix}.onnx", reduced=args.reduced, seed=args.seed)
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
