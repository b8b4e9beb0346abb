"""benchmarks/bench_calibration_u50.py: the DPUCAHX8H calibration against AMD's U50 / U50LV / U280 figures. Our
DPUCAHX8H programs are compiled (a reduced network here; the benchmark compiles full size), cached and timed at a
row's clock; rows are split as declared and compared only where the work is the same; the fit picks the grid point
the fit rows match; vai_c's vendored U50LV program is timed; the full run is a slow test."""
from __future__ import annotations

import json
import os

import pytest

from conftest import load_bench
from tvm_dpu.timing.params import load_params


@pytest.fixture(scope="module")
def bench():
    return load_bench("bench_calibration_u50")


def test_gop_and_utilisation_from_the_zoo_name(bench):
    assert bench.gop("cf_resnet50_imagenet_224_224_7.7G") == 7.7
    assert bench.gop("tf_mobilenetv2_1.0_imagenet_224_224_602M") == pytest.approx(0.602)
    assert bench.gop("torchvision_resnet50") is None


def test_a_program_is_compiled_cached_and_timed_at_the_rows_clock(bench, tmp_path):
    prog = bench.compile_program("resnet18", "DPUCAHX8H_ISA2", tmp_path, reduced=True)
    assert prog.words > 0 and len(prog.subgraphs) == 1 and prog.subgraphs[0][2] > 0  # real ops counted
    again = bench.compile_program("resnet18", "DPUCAHX8H_ISA2", tmp_path, reduced=True)
    assert list((tmp_path).glob("*.pkl")) and all((a == b).all() for (a, _, _), (b, _, _) in
                                                   zip(prog.subgraphs, again.subgraphs))
    p = load_params("u50")
    fast, slow = (prog.ms(bench.board_at("u50lv", mhz), p) for mhz in (275.0, 137.5))
    # the engine's cycles barely move with the clock (only the HBM's bytes per cycle do): half the clock, ~2x time
    assert 1.8 < slow / fast <= 2.0
    # a longer conv fill makes the same program slower: the fit's lever is real
    u50 = bench.board_at("u50", 300.0)
    assert prog.ms(u50, p.replace(conv_fill_cycles=p.conv_fill_cycles + 224)) > prog.ms(u50, p)


def test_same_work_rule(bench):
    from published import load_published

    rows = {(r.release, r.board, r.zoo_name): r for r in load_published() if r.arch.startswith(bench.FAMILY)}
    prog = bench.Program("resnet50", "DPUCAHX8H_ISA2", ((None, [], 8.2e9),), 1)  # 8.2 GOP: our ResNet-50
    assert bench.same_work(rows[("1.4", "u50", "cf_resnet50_imagenet_224_224_7.7G")], prog)  # within 15%
    assert not bench.same_work(rows[("1.4", "u50", "tf_resnetv1_50_imagenet_224_224_6.97G")], prog)  # 15% off
    assert bench.same_work(rows[("1.4", "u50", "torchvision_resnet50")], prog)  # match "same", no GOP in the name
    assert bench.same_work(rows[("1.4", "u50", "torchvision_resnet50")], None) is None


def test_fit_picks_the_grid_point_the_fit_rows_match(bench):
    """Predictors whose time grows with conv_fill_cycles: the fit finds the fill that makes them match, ignores the
    validation rows and the rows of other work."""
    base = load_params("u50")

    def prog(scale):
        return lambda p, mhz: scale * p.conv_fill_cycles / mhz

    rows = [{"use": "fit", "freq_mhz": 300.0, "engine_ms": 160 * s / 300.0, "_predict": prog(s), "same_work": True}
            for s in (1.0, 2.0)]
    rows.append({"use": "fit", "freq_mhz": 300.0, "engine_ms": 1.0, "_predict": prog(5.0), "same_work": False})
    rows.append({"use": "validation", "freq_mhz": 300.0, "engine_ms": 1.0, "_predict": prog(9.0), "same_work": True})
    f = bench.fit(rows, base, {"conv_fill_cycles": (96, 160, 224)})
    assert f["change"] == {"conv_fill_cycles": 160} and f["fit_rows"] == 2 and f["mse"] == pytest.approx(0.0)
    assert bench.fit([r for r in rows if r["use"] == "validation"], base) is None
    bench.predict_all(rows, base.replace(conv_fill_cycles=160))
    stats = bench.error_stats(rows)
    assert stats["fit"]["max_abs"] == pytest.approx(0.0) and stats["fit_all_rows"]["n"] == 3
    assert stats["validation"]["median_abs"] == pytest.approx(9.0 * 160 / 300 - 1)


def test_vendored_vaic_program_is_timed(bench, monkeypatch):
    monkeypatch.delenv("TVM_DPU_XMODELS", raising=False)
    recs = bench.vaic_records()
    tf2 = next(v for v in recs if v["key"] == "tf2_custom_op u50lv")
    assert tf2["available"] and tf2["dpu_ms"] > 0 and tf2["instructions"] == 80
    # the private PointPillars programs are listed as not available, never dropped
    pp = [v for v in recs if v["key"].startswith("pointpillars")]
    assert pp and all(v["available"] or "not found" in v["why"] for v in pp)


def test_committed_results_and_params_agree(bench):
    """The committed results are a run of this benchmark, and params_dpucahx8h.json holds its fitted point."""
    data = json.loads((bench.DEFAULT_JSON).read_text())
    assert data["rows_with_program"] > 0 and data["fitted"] is not None
    assert all(bench.SPLIT.get((r["release"], r["board"]), "validation") == r["use"] for r in data["rows"])
    assert {r["board"] for r in data["rows"] if r["use"] == "fit"} == {"u50", "u50lv"}
    p = load_params("u50")
    assert all(getattr(p, k) == v for k, v in data["fitted"]["change"].items())
    for split in ("fit", "validation"):
        s = data["error"][split]
        assert s["n"] > 0 and 0 <= s["median_abs"] <= s["max_abs"]
    text = bench.DOCS.read_text()
    assert bench.docs_section(data) in text


@pytest.mark.slow
@pytest.mark.skipif(not os.environ.get("TVM_DPU_U50_CALIBRATION"), reason="compiles 15 full-size programs (minutes); "
                    "set TVM_DPU_U50_CALIBRATION=1")
def test_full_run(bench, tmp_path):
    out = tmp_path / "u50.json"
    assert bench.main(["--json", str(out)]) == 0
    data = json.loads(out.read_text())
    assert data["rows_with_program"] == len(data["rows"])
