"""Draw the README's picture: the timing model's engine timeline of the bundled example's largest DPU subgraph,
compiled exactly as the README's first command compiles it (zcu102, the bundled calibration file).

    python scripts/readme_picture.py [--out docs/example_timeline.png]

The picture is the project's own output (tvm_dpu.timing.trace.write_gantt_png), so regenerate it whenever the
compiler or the timing model changes what the example's program does.
"""
from __future__ import annotations

import argparse
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(ROOT / "docs" / "example_timeline.png"), help="the PNG to write")
    args = parser.parse_args()

    import tvm_dpu
    from tvm_dpu.timing.trace import write_gantt_png

    model = tvm_dpu.build(str(ROOT / "examples" / "mixed_cnn.onnx"), arch="zcu102",
                          calibration=str(ROOT / "examples" / "mixed_cnn_calib.npz"))
    timing = model.timing()
    symbol, result = max(timing.subgraphs.items(), key=lambda kv: kv[1].cycles)
    sid = model.subgraph_ids.get(symbol, symbol)
    title = (f"examples/mixed_cnn.onnx on zcu102, DPU subgraph {sid}: engine timeline predicted by the timing model "
             f"({result.latency_s * 1e6:.1f} us, {result.cycles:.0f} cycles)")
    path = write_gantt_png(result, args.out, title=title)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
