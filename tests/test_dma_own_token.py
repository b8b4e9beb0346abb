"""timing parameter dma_own_token: when a LOAD/SAVE posts its own engine's token (completion | transfer_end)."""
from __future__ import annotations

import pytest

from tvm_dpu.codegen.program import Program
from tvm_dpu.timing.params import TimingError, load_params, machine
from tvm_dpu.timing.simulate import simulate

ARCH = "DPUCZDX8G_ISA1_B4096"


def _loads(n: int):
    """n LOADs into different banks: nothing links them but their own engine's tokens."""
    prog = Program()
    for i in range(n):
        prog.emit("LOAD", reads=[("ddr", f"x{i}")], writes=[("vb0", i)], bank_id=i, length=4, channel=16,
                  jump_read=16, ddr_addr=8192 * (i + 1))
    prog.emit("END")
    return prog.encode()


def test_default_is_transfer_end_and_bad_values_are_named():
    # the reading vai_c's published figures favour (docs/timing-model.md, calibration section)
    assert load_params(ARCH).dma_own_token == "transfer_end"
    with pytest.raises(TimingError, match="dma_own_token='eventually'"):
        load_params(ARCH, dma_own_token="eventually")


def test_transfer_end_takes_the_ddr_latency_off_the_own_engine_chain():
    code = _loads(5)
    base = load_params(ARCH).replace(dma_own_token="completion")
    lat = machine(ARCH, base).ddr_latency_cycles
    assert lat > 0
    done = simulate(code, ARCH, base).cycles
    early = simulate(code, ARCH, base.replace(dma_own_token="transfer_end")).cycles
    # each of the 4 later LOADs waited out its predecessor's round trip; now none does (the last one's latency
    # still ends the program)
    assert done - early == pytest.approx(4 * lat, rel=0.05)
    # with no DDR latency the two readings are the same machine
    flat = base.replace(ddr_latency_ns=0.0)
    assert simulate(code, ARCH, flat).cycles == simulate(code, ARCH, flat.replace(dma_own_token="transfer_end")).cycles
