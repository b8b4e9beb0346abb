"""timing.floor: the DDR floor of a network (inputs and weights read once, outputs written once) at the timing
model's rates, checked against the rates it is made of and against vai_c's programs, none of which the simulator
times faster than its floor."""
from __future__ import annotations

from pathlib import Path

import pytest

from tvm_dpu.timing.floor import ddr_floor
from tvm_dpu.timing.params import machine
from tvm_dpu.timing.simulate import simulate


def test_shared_data_ports_bound_isa1():
    m = machine("DPUCZDX8G_ISA1_B4096")
    rate = m.dma_beats_per_cycle * m.axi_bytes
    f = ddr_floor("DPUCZDX8G_ISA1_B4096", 1_000_000, 500_000, 20_000)
    # ISA1: weights come through the same ports as the maps
    assert f.bound == "data port" and f.cycles == pytest.approx((1_000_000 + 500_000 + 20_000) / rate)


def test_dpucahx8h_weights_have_ports_of_their_own():
    arch = "DPUCAHX8H_ISA2"
    m = machine(arch)
    data = m.dma_beats_per_cycle * m.axi_bytes
    wrate = m.params.weight_ports * m.port_beats_per_cycle * m.axi_bytes
    f = ddr_floor(arch, 4_800_000, 76_800_000, 320)
    assert f.bound == "data port" and f.cycles == pytest.approx(81_600_000 / data)
    # weights alone: the LOAD engine carries them at the weight ports' rate, not the data port's
    g = ddr_floor(arch, 1000, 10, 1_000_000)
    assert g.bound == "LOAD engine" and g.cycles == pytest.approx(1000 / data + 1_000_000 / wrate)
    assert g.cycles < ddr_floor("DPUCZDX8G_ISA1_B4096", 1000, 10, 1_000_000).cycles * 10


@pytest.mark.parametrize("name", ["dpu_pynq/dpu_mnist_classifier.xmodel", "tf2_custom_op_vai3.0_isa1.xmodel",
                                  "dpucahx8h/tf2_custom_op_vai2.5_u50lv.xmodel"])
def test_no_program_beats_the_floor(name):
    """vai_c's own programs (ISA1 and DPUCAHX8H) on the timing model: none is faster than its subgraph's floor, and
    the floor counts exactly the subgraph's I/O and constant bytes."""
    import numpy as np

    from tvm_dpu.arch.arch import arch_from_fingerprint
    from tvm_dpu.xmodel.compare import ddr_floor as subgraph_floor
    from tvm_dpu.xmodel.model import read_xmodel

    xm = read_xmodel(Path(__file__).parent / "data" / "xmodel" / name)
    for d in xm.dpu_subgraphs():
        arch = arch_from_fingerprint(d.fingerprint)
        f = subgraph_floor(xm, d, arch)
        assert f["read_bytes"] == sum(t.nbytes for t in d.inputs) > 0
        assert f["write_bytes"] == sum(t.nbytes for t in d.outputs) > 0
        assert f["weight_bytes"] > 0
        r = simulate(np.frombuffer(d.mc_code, "<u4"), arch)
        assert 0 < f["cycles"] <= r.cycles, (d.name, f, r.cycles)
