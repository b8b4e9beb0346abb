"""`tvm-dpu compare`: vai_c's DPU programs beside tvm-dpu's compile of the same quantized ops (QDQ rebuild)."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tvm_dpu.cli import main
from tvm_dpu.codegen.isa import decode_program
from tvm_dpu.xmodel.compare import compare
from tvm_dpu.xmodel.encode import encode_graph
from tvm_dpu.xmodel.model import read_xmodel
from tvm_dpu.xmodel.reader import decode_graph

DATA = Path(__file__).parent / "data" / "xmodel"
ISA1 = sorted(DATA.glob("*isa1*.xmodel"))


@pytest.mark.parametrize("path", ISA1, ids=[p.stem for p in ISA1])
def test_vai_c_conv_subgraph_matches_ours_int8(path):
    res = compare(path, seed=3)
    d = {x.name: x for x in read_xmodel(path).dpu_subgraphs()}
    (conv,) = res.subgraphs  # conv/pool stack: rebuilt and compared
    assert conv.name == "subgraph_quant_conv2d"
    assert conv.total == 256 and conv.differing == 0 and conv.outputs_equal
    code = np.frombuffer(d[conv.name].mc_code, "<u4")
    assert sum(conv.vai_c.instructions.values()) == len(decode_program(code))
    assert conv.vai_c.instructions["CONV"] == conv.ours.instructions["CONV"] == 18
    # DDR bytes one run moved: at least the input (784 B) and weights read, the 256-byte output written
    assert conv.vai_c.ddr_read_bytes > 100_000 and conv.vai_c.ddr_write_bytes == 256
    assert conv.ours.ddr_write_bytes >= 256
    assert conv.ours.cycles is not None and conv.ours.cycles > 0
    # vai_c's program: cycles, or the timing model's error (reported, not raised)
    assert (conv.vai_c.cycles is None) == (conv.vai_c.timing_error is not None)
    # the dense subgraph's bias has fix_point fp_in + fp_w + 1 and odd values: refused with the reason
    (why,) = res.not_compared.values()
    assert "shift_bias field to 0" in why and "fp_bias <= fp_in + fp_w" in why
    assert "int8 outputs equal (0 of 256" in res.table()


def test_isa0_is_not_compared_with_reason():
    res = compare(DATA / "tf2_custom_op_vai1.4_isa0.xmodel")
    assert not res.subgraphs and len(res.not_compared) == 2
    assert all("ISA1 only" in why for why in res.not_compared.values())
    assert main(["compare", str(DATA / "tf2_custom_op_vai1.4_isa0.xmodel")]) == 1


def _own_xmodel(tmp_path):
    from test_xmodel_write import _build  # the same small model the writer tests export

    return _build().export(tmp_path / "own.xmodel")


def test_our_own_xmodel_compares_equal(tmp_path, capsys):
    """Our exported xmodel's ops carry their int8 constants: the rebuild compiles back to the same programs."""
    res = compare(_own_xmodel(tmp_path))
    assert len(res.subgraphs) == 2 and not res.not_compared
    for s in res.subgraphs:
        assert s.outputs_equal and s.total > 0
        assert s.vai_c.instructions == s.ours.instructions
        assert s.vai_c.cycles == s.ours.cycles and s.cycle_ratio == 1.0
    assert main(["compare", str(tmp_path / "own.xmodel")]) == 0
    assert "ratio ours/vai_c: 1.000" in capsys.readouterr().out


def test_op_without_rebuild_is_named(tmp_path):
    g = decode_graph(_own_xmodel(tmp_path).read_bytes())
    for op in g["op_node"]:
        if op["op_type"] == "pool-fix":
            op["op_type"] = "mystery-fix"
    bad = tmp_path / "bad.xmodel"
    bad.write_bytes(encode_graph(g))
    res = compare(bad)
    assert len(res.subgraphs) == 1
    (why,) = res.not_compared.values()
    assert "DPU op 'pool1' of type 'mystery-fix' cannot be rebuilt" in why
