"""`tvm-dpu dse --part u50lv`: a fixed-bitstream Alveo card is explored by overlay (DPUCAHX8H_ISA2 / _DWC), engines
used and batch (tvm_dpu/pipeline/dse_card.py), not refused."""
from __future__ import annotations

import json
import math

import pytest

from tvm_dpu.arch import load_arch
from tvm_dpu.arch.parts import part_info
from tvm_dpu.cli import main
from tvm_dpu.errors import ArchError
from tvm_dpu.pipeline.dse_card import card_candidates, card_overlays, is_card
from tvm_dpu.pipeline.plan import PlanError


def test_cards_and_their_overlays():
    assert [a.name for a in card_overlays("u50lv")] == ["u50lv", "u50lv-dwc"]
    assert [a.dpu_name for a in card_overlays("U50LV")] == ["DPUCAHX8H_ISA2", "DPUCAHX8H_ISA2_DWC"]
    assert [a.name for a in card_overlays("u280")] == ["u280"]
    assert is_card("u50") and not is_card("zu9eg")
    with pytest.raises(PlanError, match="'zcu102' is not an Alveo card preset"):
        card_overlays("zcu102")
    # a Zynq-part lookup of a card points at the card's dse instead of listing parts only
    with pytest.raises(ArchError, match="u50lv is an Alveo card carrying 10 x DPUCAHX8H_ISA2 engines .* ranks its "
                                        "overlays, engines and batch"):
        part_info("u50lv")


def test_engines_and_batch_arithmetic():
    ov = load_arch("u50lv")  # 10 engines at 275 MHz
    cycles = 275e3  # 1 ms per frame on one engine
    rows = card_candidates("u50lv", ov, cycles, 0.0, batches=(1, 10))
    by = {(c.engines, c.batch): c for c in rows}
    assert by[(1, 1)].fps == pytest.approx(1000.0) and by[(1, 1)].batch_ms == pytest.approx(1.0)
    assert by[(10, 10)].fps == pytest.approx(10000.0) and by[(10, 10)].batch_ms == pytest.approx(1.0)
    assert by[(5, 10)].batch_ms == pytest.approx(2.0) and by[(4, 10)].batch_ms == pytest.approx(3.0)
    # engines idle for the whole batch are not offered: 6..9 engines finish 10 frames in 2 rounds, as 5 do
    assert {k for k, b in by if b == 10} == {1, 2, 3, 4, 5, 10} and {k for k, b in by if b == 1} == {1}
    # another clock rescales the engine time; the host's CPU ops cap the card
    fast = card_candidates("u50lv", ov, cycles, 0.0, batches=(10,), clocks_mhz=(550.0,))
    assert max(c.fps for c in fast) == pytest.approx(20000.0)
    capped = card_candidates("u50lv", ov, cycles, 0.5, batches=(10,))
    top = next(c for c in capped if c.engines == 10)
    assert top.fps == pytest.approx(2000.0) and top.host_bound
    assert max(c.fps for c in capped) == pytest.approx(2000.0)  # 2 engines already reach the host's rate
    assert all(math.isclose(c.latency_ms, 1.0) for c in rows)


def test_cli_ranks_the_u50lv_overlays(tmp_path, capsys):
    from tvm_dpu import zoo

    onnx_path = zoo.save_model("mixed_cnn", tmp_path / "m.onnx", reduced=True)
    out = tmp_path / "dse.json"
    assert main(["dse", str(onnx_path), "--part", "u50lv", "--batch", "1,10", "--json", str(out), "-q"]) == 0
    text = capsys.readouterr().out
    assert "u50lv: fixed overlays u50lv (10 x DPUCAHX8H_ISA2 engines at 275 MHz), u50lv-dwc (8 x" in text
    cands = json.loads(out.read_text())
    assert {c["overlay"] for c in cands} == {"u50lv", "u50lv-dwc"}
    assert cands == sorted(cands, key=lambda c: (-c["fps"], c["batch_ms"], c["engines"], c["overlay"]))
    one = next(c for c in cands if c["overlay"] == "u50lv" and c["engines"] == 1 and c["batch"] == 1)
    ten = next(c for c in cands if c["overlay"] == "u50lv" and c["engines"] == 10 and c["batch"] == 10)
    host = 1e3 / one["cpu_ms"] if one["cpu_ms"] else math.inf  # mixed_cnn keeps ops on the CPU
    assert ten["fps"] == pytest.approx(min(10 * 1e3 / one["latency_ms"], host))
    assert cands[0]["fps"] == pytest.approx(max(c["fps"] for c in cands)) and cands[0]["overlay"] == "u50lv"
    # a budget means nothing on a fixed overlay; --batch nothing on a Zynq part
    assert main(["dse", str(onnx_path), "--part", "u50lv", "--dsp", "100", "-q"]) != 0
    assert "--dsp with --part u50lv: an Alveo card's DPU is a fixed overlay" in capsys.readouterr().err
    assert main(["dse", str(onnx_path), "--part", "zu3eg", "--batch", "4", "-q"]) != 0
    assert "--batch applies to an Alveo card" in capsys.readouterr().err
