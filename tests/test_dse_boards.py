"""DSE as AMD's boards build it (tvm_dpu/arch/parts.json, pipeline/dse.py explore_part): URAM, RAM usage, the
platform reserve, per-part DDR and clock; the slow test checks the picks against AMD's shipped configurations."""
from __future__ import annotations

import pytest

import tvm_dpu
from tvm_dpu import zoo
from tvm_dpu.arch.parts import list_parts, platform_reserve, shipped
from tvm_dpu.pipeline.dse import core_costs, device_budget, explore_part, part_conditions
from tvm_dpu.pipeline.plan import PlanError


def test_part_data_and_conditions():
    assert list_parts() == ["zu2eg", "zu3eg", "zu5ev", "zu7ev", "zu9eg"]
    assert device_budget("ZU5EV") == {"dsp": 1248, "bram36k": 144, "lut": 117120, "uram": 64}
    with pytest.raises(PlanError, match="known parts"):
        device_budget("zu99eg")
    # per-part DDR and clock come from the board carrying the part (presets.json)
    u96 = part_conditions("zu3eg")
    assert u96["board"] == "ultra96" and u96["clock_mhz"] == 287.0 and u96["ddr_bytes_per_s"] == 8.5e9
    z102 = part_conditions("zu9eg")
    assert z102["clock_mhz"] == 281.0 and z102["ddr_bytes_per_s"] == 17.1e9
    frac = platform_reserve()["bram36k"]
    assert z102["budget"]["bram36k"] == pytest.approx(912 * (1 - frac))
    assert part_conditions("zu9eg", reserve=False)["budget"]["bram36k"] == 912
    for part in ("zu3eg", "zu5ev", "zu7ev", "zu9eg"):
        assert shipped(part)["source"] and shipped(part)["dpu"]


def test_core_costs_ram_usage_and_uram_option():
    low = core_costs("high", "low")
    assert low["B4096"][0] == {"dsp": 642, "lut": 40865, "bram36k": 255.0, "uram": 0}
    # the UltraRAM option, B4096 only: 23 banks of 8 BRAM36K -> 2 URAM each
    assert low["B4096"][1] == {"dsp": 642, "lut": 40865, "bram36k": 255.0 - 184, "uram": 46}
    assert all(len(ways) == 1 for name, ways in low.items() if name != "B4096")
    assert core_costs("high")["B4096"][0]["bram36k"] == 249.5  # PG338 v1.2 Table 9 without ram_usage
    assert core_costs("low", "high")["B1600"][0] == {"dsp": 202, "lut": 33130, "bram36k": 162.0, "uram": 0}
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
        else:
            assert all(c.uram == 0 for c in cands)  # no URAM on a ZU3EG
            # 3 x B512 takes all 216 BRAM36K: the reserve leaves it out
            assert not [c for c in cands if c.dpu == "B512" and c.cores == 3]
            assert [c for c in explore_part(small, part, reserve=False, cache=cache)
                    if c.dpu == "B512" and c.cores == 3]
    assert {c.dsp_usage for c in cands} == {"high", "low"}


@pytest.mark.slow
def test_picks_match_the_boards_amd_ships():
    """Full-size ResNet-50: ZCU102 3 x B4096, Ultra96 B1600 or B2304, KV260 B3136 or B4096 (with the platform
    reserve; docs/pipeline.md's table gives the picks without it and why they differ)."""
    proto = zoo.build_model("resnet50")
    model = tvm_dpu.build(proto, arch="B4096", calibration=[zoo.random_input(proto, seed=0)], progress=False)
    cache: dict = {}
    for part in ("zu9eg", "zu3eg", "zu5ev"):
        best = explore_part(model, part, cache=cache)[0]
        ship = shipped(part)
        assert best.dpu in ship["dpu"] and best.cores in ship["cores"], (part, best.dpu, best.cores)
