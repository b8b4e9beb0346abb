"""DSE as AMD's boards build it (tvm_dpu/arch/parts.json, pipeline/dse.py explore_part): URAM, RAM usage, the
platform reserve, per-part DDR and clock; the slow test checks the picks against AMD's shipped configurations."""
from __future__ import annotations

import pytest

import tvm_dpu
from tvm_dpu import zoo
from tvm_dpu.arch.parts import list_parts, part_ddr, part_info, platform_reserve, platform_reserve_sources, shipped
from tvm_dpu.pipeline.dse import core_costs, device_budget, explore_part, part_conditions
from tvm_dpu.pipeline.plan import PlanError


def test_part_data_and_conditions():
    assert list_parts() == ["zu2eg", "zu3eg", "zu5ev", "zu7ev", "zu9eg"]
    assert device_budget("ZU5EV") == {"dsp": 1248, "bram36k": 144, "lut": 117120, "uram": 64}
    with pytest.raises(PlanError, match="known parts"):
        device_budget("zu99eg")
    # DPU clock from the board carrying the part (presets.json), DDR from that board's platform (parts.json)
    u96 = part_conditions("zu3eg")
    assert u96["board"] == "ultra96" and u96["clock_mhz"] == 287.0
    assert u96["ddr_bytes_per_s"] == pytest.approx(32 / 8 * 2134e6)  # 32-bit at 2,134 MT/s
    z102 = part_conditions("zu9eg")
    assert z102["clock_mhz"] == 281.0 and z102["ddr_bytes_per_s"] == pytest.approx(64 / 8 * 2134e6)
    assert part_ddr("zu2eg")[0] is None and part_conditions("zu2eg")["ddr_bytes_per_s"] == 17.1e9
    # the reserve is absolute blocks, the same on every part: a small part loses the same LUTs as a large one
    res = platform_reserve()
    assert res == {"dsp": 0.0, "bram36k": 0.0, "lut": 14410.0 + 2700.0, "uram": 0.0}
    for part in ("zu3eg", "zu9eg"):
        full = part_conditions(part, reserve=False)["budget"]
        assert part_conditions(part)["budget"] == {k: full[k] - res[k] for k in full}
    for part in ("zu3eg", "zu5ev", "zu7ev", "zu9eg"):
        assert shipped(part)["source"] and shipped(part)["dpu"]
        assert part_info(part)["source"] and part_ddr(part)[1]


def test_every_value_has_a_source():
    for part in list_parts():
        info = part_info(part)
        assert info["source"] and info["clock_source"] and part_ddr(part)[1], part
    for name, comp in platform_reserve_sources().items():
        assert set(comp) == {"dsp", "bram36k", "lut", "uram"}, name
        assert all(src for _, src in comp.values()), name


def test_core_costs_ram_usage_uram_and_depthwise():
    low = core_costs("high", "low")
    assert low["B4096"][0] == {"dsp": 642, "lut": 40865, "bram36k": 255.0, "uram": 0}
    # the UltraRAM option: AMD's 5 + 17 + 1 banks, ICP 16 x 8 bits = 128 > 72 -> 2 URAM each, 8 BRAM36K freed each
    assert low["B4096"][1] == {"dsp": 642, "lut": 40865, "bram36k": 255.0 - 23 * 8, "uram": 46}
    # every size has it now: B1024 (ICP 8: one URAM per bank) 4 + 9 + 1 banks, B3136 4 + 15 + 1
    assert low["B1024"][1]["uram"] == 14 and low["B1024"][1]["bram36k"] == 104 - 14 * 4
    assert low["B3136"][1]["uram"] == 40 and low["B3136"][1]["bram36k"] == 208 - 20 * 7
    assert all(len(ways) == 2 for ways in low.values())
    assert core_costs("high")["B4096"][0]["bram36k"] == 249.5  # PG338 v1.2 Table 9 without ram_usage
    assert core_costs("low", "high")["B1600"][0] == {"dsp": 202, "lut": 33130, "bram36k": 162.0, "uram": 0}
    # depthwise convolution (PG338 v3.4): B3136 high 506 + 42 = 548 DSP, what the K26 builds measure; the v1.2
    # BRAM gets the depthwise BRAM (203.5 + 6.5 = 210, v3.4's low-RAM figure), the v4.0 table has it already
    dw = core_costs("high", "low", depthwise=True)
    assert dw["B3136"][0] == {"dsp": 548, "lut": 38555 + 4269, "bram36k": 208.0, "uram": 0}
    assert dw["B2304"][0]["dsp"] == 386 + 36
    assert core_costs("high", None, depthwise=True)["B3136"][0]["bram36k"] == 210.0
    with pytest.raises(PlanError, match="ram_usage"):
        core_costs("high", "medium")


@pytest.fixture(scope="module")
def small():
    proto = zoo.build_model("resnet18", reduced=True)
    return tvm_dpu.build(proto, arch="B4096", calibration=[zoo.random_input(proto, seed=0)], progress=False)


def test_explore_part_respects_reserve_and_uram(small):
    cache: dict = {}
    for part in ("zu5ev", "zu3eg"):
        budget = part_conditions(part)["budget"]
        cands = explore_part(small, part, cache=cache)
        assert cands and [c.fps for c in cands] == sorted((c.fps for c in cands), reverse=True)
        for c in cands:
            assert c.dsp <= budget["dsp"] and c.bram36k <= budget["bram36k"] and c.lut <= budget["lut"]
            assert c.uram <= budget["uram"] and c.freq_mhz == part_conditions(part)["clock_mhz"]
        if part == "zu5ev":
            # B4096 needs 255 BRAM36K, more than the ZU5EV's 144: only the UltraRAM option fits it
            b4096 = [c for c in cands if c.dpu == "B4096"]
            assert b4096 and all(c.uram == 46 and c.cores == 1 for c in b4096)
            assert any(c.uram and c.dpu != "B4096" for c in cands)  # the option exists for other sizes too
        else:
            assert all(c.uram == 0 for c in cands)  # no URAM on a ZU3EG
            # 3 x B512 with depthwise needs 65,733 LUT or more: over the 53,450 the shell and interconnect leave
            assert not [c for c in cands if c.dpu == "B512" and c.cores == 3]
            assert [c for c in explore_part(small, part, reserve=False, cache=cache)
                    if c.dpu == "B512" and c.cores == 3]
    assert {c.dsp_usage for c in cands} == {"high", "low"}


def test_explore_part_restricted_to_core_sizes(small):
    """AMD's objective (one core size on every board): with B4096 only, a ZU9EG takes 3 cores (4 x 255 BRAM36K is
    more than its 912)."""
    cands = explore_part(small, "zu9eg", archs=("B4096",))
    assert {c.dpu for c in cands} == {"B4096"} and max(c.cores for c in cands) == 3
    with pytest.raises(PlanError, match="B9999"):
        explore_part(small, "zu9eg", archs=("B9999",))


@pytest.mark.slow
def test_picks_match_the_boards_amd_ships():
    """Full-size ResNet-50, the unrestricted top pick: ZCU102 3 x B4096, ZCU104 2 x B4096, Ultra96 B1600 or B2304,
    KV260 B3136 or B4096 (docs/pipeline.md's table gives the margins and what each pick depends on). Restricted to
    B4096, the one core size AMD ships on ZCU102, the count is still 3."""
    proto = zoo.build_model("resnet50")
    model = tvm_dpu.build(proto, arch="B4096", calibration=[zoo.random_input(proto, seed=0)], progress=False)
    cache: dict = {}
    for part in ("zu9eg", "zu7ev", "zu3eg", "zu5ev"):
        best = explore_part(model, part, cache=cache)[0]
        ship = shipped(part)
        assert best.dpu in ship["dpu"] and best.cores in ship["cores"], (part, best.dpu, best.cores)
    amd = explore_part(model, "zu9eg", cache=cache, archs=("B4096",))[0]
    assert (amd.dpu, amd.cores) == ("B4096", 3)
