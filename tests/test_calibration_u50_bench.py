"""benchmarks/bench_calibration_u50.py: the DPUCAHX8H calibration against AMD's U50 / U50LV / U280 figures. While
tvm-dpu compiles no DPUCAHX8H program, every published row says why it has none and no fit runs; vai_c's vendored
U50LV program is timed; the fit, once rows have programs, picks the grid point that matches them."""
from __future__ import annotations

import json

import pytest

from conftest import load_bench
from tvm_dpu.timing.params import load_params


@pytest.fixture(scope="module")
def bench():
    return load_bench("bench_calibration_u50")


def test_rows_split_and_say_why_there_is_no_program(bench, tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("TVM_DPU_XMODELS", raising=False)
    # DPUCAHX8H compiles now: the real run builds every published network for its card (minutes, the calibration
    # is the next step of issue 39); here the hook says no program, to check the split and the no-fit path fast
    monkeypatch.setattr(bench, "our_program",
                        lambda network, board: (None, "tvm-dpu compiles no DPUCAHX8H program in this test"))
    out = tmp_path / "u50.json"
    assert bench.main(["--json", str(out)]) == 0
    data = json.loads(out.read_text())
    rows = data["rows"]
    assert rows and {r["use"] for r in rows} == {"fit", "validation"}
    assert all(bench.SPLIT.get((r["release"], r["board"]), "validation") == r["use"] for r in rows)
    assert {r["board"] for r in rows if r["use"] == "fit"} == {"u50", "u50lv"}
    assert data["rows_with_program"] == 0 and data["fitted"] is None
    assert all(r["program"] is None and "compiles no DPUCAHX8H program" in r["why_no_program"] for r in rows)
    assert all(0 < r["implied_utilisation"] < 1 for r in rows if r["implied_utilisation"] is not None)
    tf2 = next(v for v in data["vaic"] if v["key"] == "tf2_custom_op u50lv")
    assert tf2["available"] and tf2["dpu_ms"] > 0 and tf2["instructions"] == 80
    # the private PointPillars programs are listed as not available, never dropped
    pp = [v for v in data["vaic"] if v["key"].startswith("pointpillars")]
    assert pp and all(v["available"] or "not found" in v["why"] for v in pp)
    assert "fit: not run (no fit row has a DPUCAHX8H program)" in capsys.readouterr().out


def test_gop_and_utilisation_from_the_zoo_name(bench):
    assert bench.gop("cf_resnet50_imagenet_224_224_7.7G") == 7.7
    assert bench.gop("tf_mobilenetv2_1.0_imagenet_224_224_602M") == pytest.approx(0.602)
    assert bench.gop("torchvision_resnet50") is None


def test_fit_picks_the_grid_point_the_fit_rows_match(bench):
    """Fake programs whose time grows with conv_fill_cycles: the fit finds the fill that makes them match."""
    base = load_params("u50")

    def prog(scale):
        return lambda p, mhz: scale * p.conv_fill_cycles / mhz

    rows = [{"use": "fit", "freq_mhz": 300.0, "engine_ms": 160 * s / 300.0, "_predict": prog(s)} for s in (1.0, 2.0)]
    rows.append({"use": "validation", "freq_mhz": 300.0, "engine_ms": 1.0, "_predict": prog(9.0)})
    f = bench.fit(rows, base, {"conv_fill_cycles": (96, 160, 224)})
    assert f["change"] == {"conv_fill_cycles": 160} and f["fit_rows"] == 2 and f["mse"] == pytest.approx(0.0)
    assert bench.fit([r for r in rows if r["use"] == "validation"], base) is None
