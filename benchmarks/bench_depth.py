"""Compile time against depth: a linear chain of N 3x3 convolutions (8 channels, 16x16) compiled for zcu102 with the
default fusion, N = 50, 100, 150, 300 (issue 40: the fusion search grew about cubically, 300 did not finish in
1200 s). Prints seconds per depth, the fusion planner's share, and the ratio of depth 300 to depth 100 (goal: under
4x, i.e. at most linear-ish growth); also reads and orders an .xmodel CPU chain of 20,000 identity ops.

    python benchmarks/bench_depth.py                      # -> results/depth.json
    python benchmarks/bench_depth.py --depths 50,100      # a quick run
"""
from __future__ import annotations

import argparse
import sys
import time
import warnings
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from results_io import write_results  # noqa: E402  (benchmarks/results_io.py)

DEFAULT_JSON = Path(__file__).resolve().parent / "results" / "depth.json"
ROOT = Path(__file__).resolve().parents[1]


def conv_chain(n: int, channels: int = 8, size: int = 16):
    """An ONNX model: n 3x3 convs (pad 1) with ReLU in a chain."""
    from onnx import TensorProto as T
    from onnx import helper as h
    from onnx import numpy_helper as nh

    rng = np.random.default_rng(0)
    nodes, inits, x = [], [], "x"
    for i in range(n):
        w = nh.from_array((rng.standard_normal((channels, channels, 3, 3)) * 0.2).astype(np.float32), f"w{i}")
        b = nh.from_array(np.zeros(channels, np.float32), f"b{i}")
        inits += [w, b]
        nodes += [h.make_node("Conv", [x, f"w{i}", f"b{i}"], [f"c{i}"], pads=[1, 1, 1, 1], kernel_shape=[3, 3]),
                  h.make_node("Relu", [f"c{i}"], [f"r{i}"])]
        x = f"r{i}"
    g = h.make_graph(nodes, "chain", [h.make_tensor_value_info("x", T.FLOAT, [1, channels, size, size])],
                     [h.make_tensor_value_info(x, T.FLOAT, [1, channels, size, size])], inits)
    return h.make_model(g, opset_imports=[h.make_opsetid("", 17)])


def compile_seconds(n: int) -> dict:
    import tvm_dpu

    model = conv_chain(n)
    x = np.random.default_rng(1).standard_normal((1, 8, 16, 16)).astype(np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        t0 = time.perf_counter()
        compiled = tvm_dpu.build(model, arch="zcu102", calibration=[x], progress=False)
        total = time.perf_counter() - t0
    y = compiled.run(x)[0]
    phases = getattr(compiled, "build_info", {}).get("phase_times", {}) if hasattr(compiled, "build_info") else {}
    return {"depth": n, "compile_s": round(total, 2), "output_finite": bool(np.isfinite(y).all()),
            "phases": {k: round(v, 2) for k, v in phases.items()} if isinstance(phases, dict) else {}}


def xmodel_chain_seconds(n: int = 20000) -> dict:
    """Read an xmodel whose graph carries an n-op identity chain and order the chain (what a run does per CPU
    subgraph)."""
    from tvm_dpu.xmodel.encode import encode_graph
    from tvm_dpu.xmodel.model import read_xmodel
    from tvm_dpu.xmodel.reader import decode_graph
    from tvm_dpu.xmodel.runner import _ops_in_order

    src = ROOT / "tests" / "data" / "xmodel" / "dpu_pynq" / "dpu_mnist_classifier.xmodel"
    g = decode_graph(src.read_bytes(), str(src))
    names = [f"chain{i}" for i in range(n)]
    g["op_node"] += [{"op_name": m, "op_type": "identity", "op_attr": {}, "output_tensor": None,
                      "args": [{"arg_name": "input", "arg_ops": [names[i - 1]]}] if i else []}
                     for i, m in enumerate(names)]
    data = encode_graph(g)
    t0 = time.perf_counter()
    model = read_xmodel(data)
    t1 = time.perf_counter()
    order = _ops_in_order(model, names[::-1])
    t2 = time.perf_counter()
    assert [op.name for op in order] == names
    return {"ops": n, "read_s": round(t1 - t0, 2), "order_s": round(t2 - t1, 2)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--depths", default="50,100,150,300")
    ap.add_argument("--json", type=Path, default=DEFAULT_JSON)
    args = ap.parse_args()
    depths = [int(d) for d in args.depths.split(",")]
    compile_seconds(3)  # warm-up: TVM's first compile in a process pays its own start-up, not the depth's
    rows = []
    for n in depths:
        rows.append(compile_seconds(n))
        print(f"depth {n:4d}: {rows[-1]['compile_s']:7.2f} s", flush=True)
    by = {r["depth"]: r["compile_s"] for r in rows}
    ratio = round(by[300] / by[100], 2) if 300 in by and 100 in by else None
    if ratio is not None:
        print(f"depth 300 / depth 100: {ratio}x (goal: under 4x)")
    chain = xmodel_chain_seconds()
    print(f"xmodel with a {chain['ops']}-op identity chain: read {chain['read_s']} s, ordered {chain['order_s']} s")
    write_results(args.json, {"rows": rows, "ratio_300_100": ratio, "xmodel_chain": chain})
    print(f"wrote {args.json}")
    return 0 if ratio is None or ratio < 4 else 1


if __name__ == "__main__":
    sys.exit(main())
