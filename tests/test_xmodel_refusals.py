"""Issue 40, item 1 and 7: a damaged .xmodel is refused with one XModelError before anything is allocated from its
numbers, and a program that cannot run (no END, zero strides, a CONST region without its weights) is refused too.
The mutations are the reliability benchmark's own (benchmarks/bench_reliability.py, campaign `xmodel`)."""
from __future__ import annotations

import random

import numpy as np
import pytest
from conftest import load_bench

from tvm_dpu.errors import XModelError
from tvm_dpu.xmodel.encode import encode_graph
from tvm_dpu.xmodel.model import read_xmodel
from tvm_dpu.xmodel.reader import decode_graph
from tvm_dpu.xmodel.runner import load_xmodel

bench = load_bench("bench_reliability")
MNIST = bench.ROOT / "tests" / "data" / "xmodel" / "dpu_pynq" / "dpu_mnist_classifier.xmodel"


def _mutant(kind: str, seed: int = 0) -> bytes:
    g = decode_graph(MNIST.read_bytes(), str(MNIST))
    bench._xmodel_mutant(g, kind, random.Random(seed))
    return encode_graph(g)


def _read_and_run(data: bytes) -> None:
    runner = load_xmodel(read_xmodel(data))
    runner.run([np.zeros(s.shape, np.float32) for s in runner.inputs])


def test_unmutated_roundtrip_runs():
    """The decode/encode round trip the mutations go through keeps the model runnable (so a refusal below is the
    mutation's doing)."""
    g = decode_graph(MNIST.read_bytes(), str(MNIST))
    _read_and_run(encode_graph(g))


@pytest.mark.parametrize("kind", [k for k in bench.MUST_REFUSE if k != "truncate"])
def test_mutation_refused_with_one_xmodel_error(kind):
    with pytest.raises(XModelError) as e:
        _read_and_run(_mutant(kind))
    assert "<bytes>" in str(e.value)  # names the file


@pytest.mark.parametrize("kind,words", [("mc_no_end", "does not end with END"), ("mc_empty", "does not end with END"),
                                        ("stride_zero", "stride of at least 1"),
                                        ("const_short", "CONST region"), ("self_input", "reads its own output"),
                                        ("cycle", "cycle"), ("size_huge", "register regions of more than"),
                                        ("dim_max", "more than the"), ("dim_zero", "at least 1"),
                                        ("mc_odd", "whole 32-bit words"), ("sub_dup_op", "held by subgraphs")])
def test_refusal_names_the_problem(kind, words):
    with pytest.raises(XModelError, match=words):
        _read_and_run(_mutant(kind))


def test_device_file_and_fifo_refused(tmp_path):
    import os

    fifo = tmp_path / "m.xmodel"
    os.mkfifo(fifo)
    for path in ("/dev/zero", fifo, tmp_path):
        with pytest.raises(XModelError, match="not a regular file|directory"):
            read_xmodel(path)


def test_long_op_chain_reads_and_orders_linearly():
    """An xmodel with a chain of 20,000 identity ops (a CPU subgraph) is read and ordered: the runner's
    ordering is linear (it was quadratic: 28 s at 4,000 ops)."""
    from tvm_dpu.xmodel.runner import _ops_in_order

    g = decode_graph(MNIST.read_bytes(), str(MNIST))
    names = [f"chain{i}" for i in range(20000)]
    g["op_node"] += [{"op_name": n, "op_type": "identity", "op_attr": {}, "args": [
        {"arg_name": "input", "arg_ops": [names[i - 1]]}] if i else [], "output_tensor": None}
        for i, n in enumerate(names)]
    model = read_xmodel(encode_graph(g))
    order = _ops_in_order(model, list(reversed(names)))
    assert [op.name for op in order] == names
