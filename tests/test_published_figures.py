"""benchmarks/data/published_figures.json (issue 35): AMD's published DPUCZDX8G figures, well-formed and loadable."""
from __future__ import annotations

import importlib
import json
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT / "benchmarks") not in sys.path:
    sys.path.insert(0, str(ROOT / "benchmarks"))
published = importlib.import_module("published")

#: Network keys that are not tvm_dpu zoo builders but public vai_c programs (benchmarks/calibration_vaic.py).
VAIC_ONLY_NETWORKS = {"yolox-nano", "pointpillars", "mnist"}


@pytest.fixture(scope="module")
def rows():
    return published.load_published()


def test_every_row_is_complete_and_unique(rows):
    assert len(rows) > 1000
    assert len({r.key for r in rows}) == len(rows)
    for r in rows:
        assert r.source and r.release and r.board and r.dpu and r.bound
        assert r.value > 0 and r.dpu_ms_upper > 0
        # the configuration string is a configuration (a table header's notes stay out) and agrees with the fields
        if r.arch.startswith("DPUCAHX8H"):  # Alveo cards (issue 39): N engines, the row's own DPU clock
            assert r.board in {"u50", "u50lv", "u50lv-dwc", "u280"} and r.threads == "multi", r.board
            assert re.fullmatch(r"\d+ x DPUCAHX8H(-DWC)? @ [\d.]+ MHz( \([^()]*engines[^()]*\))?", r.dpu), r.dpu
        else:
            assert r.board in {"zcu102", "zcu104", "kv260", "ultra96"}, r.board
            assert re.fullmatch(r"\d x B\d+F? @ \d+ MHz( \(DPU IP [^()]*\))?", r.dpu), r.dpu
        assert r.dpu.startswith(f"{r.cores} x {r.arch}") and f"@ {r.freq_mhz:g} MHz" in r.dpu


def test_alveo_rows_are_the_zoo_tables_and_the_board_presets(rows):
    """The DPUCAHX8H rows (issue 39): engines and clocks as the tables and the board presets (PG367) state, the
    bound per engine, and AMD's two swapped MLPerf cells of 2.5 left out."""
    from tvm_dpu.arch import load_arch

    sel = published.select
    r50 = {(r.release, r.board): r for r in sel(rows, zoo_name="cf_resnet50_imagenet_224_224_7.7G")
           if r.arch.startswith("DPUCAHX8H")}
    assert (r50[("1.4", "u50")].value, r50[("1.4", "u50")].freq_mhz) == (573.5, 300.0)
    assert (r50[("2.0", "u50lv")].value, r50[("2.0", "u50lv")].freq_mhz) == (691.01, 192.5)
    assert r50[("1.4", "u280")].dpu_ms_upper == pytest.approx(14 * 1000 / 800.1, abs=1e-4)
    for board in ("u50", "u50lv", "u50lv-dwc", "u280"):
        card = sel(rows, board=board)
        assert card and {r.cores for r in card} == {load_arch(board).cores}, board
        assert all(r.freq_mhz <= load_arch(board).freq_mhz for r in card)  # the zoo scaled clocks down, never up
    assert not sel(rows, release="2.5", zoo_name="tf_mlperf_resnet34_coco_1200_1200_433G", board="u50lv")
    assert not [r for r in rows if r.arch.startswith("DPUCAHX8H") and r.network == "pointpillars"]


def test_bounds_are_ordered_as_their_meaning_says(rows):
    """Single-thread end to end covers ARM work that multi-threading overlaps: on a single-core board, 1/fps
    multi-thread never exceeds the single-thread per-frame time of the same figure set."""
    by = {r.key: r for r in rows}
    checked = 0
    for r in rows:
        if r.cores == 1 and r.threads == "multi":
            single = by.get((r.release, r.board, r.board_rev, r.zoo_name, "fps", "single"))
            if single is not None:
                checked += 1
                assert r.dpu_ms_upper <= single.dpu_ms_upper * 1.0001, (r.zoo_name, r.release, r.board)
    assert checked > 100


def test_issue_figures_and_boards_as_the_tables_state(rows):
    """The figures issue 35 quotes, read back through select(), on the configurations the tables name."""
    sel = published.select
    mnv2 = sel(rows, network="mobilenetv2", board="kv260", release="2.5", threads="multi")
    assert [r.value for r in mnv2] == [336.82]
    assert mnv2[0].zoo_name.startswith("tf_mobilenetv2_1.0") and mnv2[0].dpu == "1 x B4096F @ 300 MHz"
    assert mnv2[0].dpu_ms_upper == pytest.approx(1000 / 336.82, abs=1e-4)
    cf = {(r.metric, r.threads): r.value for r in sel(rows, zoo_name="cf_mobilenetv2_imagenet_224_224_0.59G",
                                                      board="kv260", release="1.4")}
    assert cf[("fps", "multi")] == 310.4 and cf[("latency_ms", "single")] == 3.95
    for r in sel(rows, board="zcu102", board_rev="0432055-05"):
        assert (r.cores, r.arch, r.freq_mhz) == (3, "B4096", 281.0)
    zoo_u96 = sel(rows, board="ultra96", release="ai-sdk-2.0.4")
    assert zoo_u96 and all((r.cores, r.arch, r.freq_mhz) == (1, "B1600", 287.0) for r in zoo_u96)
    # DPU-PYNQ's Ultra96 overlay ran its B1600 at 300 MHz: a row per configuration, never mixed up
    assert {r.freq_mhz for r in sel(rows, board="ultra96", metric="dpu_ms")} == {300.0}


def test_the_calibration_figures_are_the_files(rows):
    """bench_calibration's v1.4 latencies and calibration_vaic's zoo figures are rows of this file (one source)."""
    calib = importlib.import_module("bench_calibration")
    for board, per_net in calib.ZOO_MS.items():
        for net, ms in per_net.items():
            hit = published.select(rows, release="1.4", board=board, metric="latency_ms",
                                   zoo_name=_unpruned_name(calib.ZOO_NAME[net], rows))
            assert [r.value for r in hit] == [ms], (board, net)
    vaic = importlib.import_module("calibration_vaic")
    release = {"yolox-nano": "3.0", "pointpillars": "2.5", "mobilenetv2": "2.5", "mnist (DPU-PYNQ)": "dpu-pynq@3d3678d"}
    network = {"mnist (DPU-PYNQ)": "mnist"}
    for row in vaic.VAIC_ROWS:
        fps = row.published if row.metric == "fps" else 1000 / row.published
        hit = published.select(rows, network=network.get(row.network, row.network), release=release[row.network],
                               board=row.board, metric="fps")
        assert any(abs(r.value - fps) < 0.005 for r in hit), row.key


def _unpruned_name(prefix: str, rows) -> str:
    """The one unpruned zoo name that starts with bench_calibration's short name (cf_resnet50 -> ..._7.7G)."""
    names = {r.zoo_name for r in rows if r.zoo_name.startswith(prefix + "_") and r.network is not None}
    assert len(names) == 1, (prefix, names)
    return names.pop()


def test_network_keys_and_vaic_programs_are_ours(rows):
    from tvm_dpu.zoo.models import REGISTRY

    listed = (ROOT / "tests" / "data" / "xmodel" / "PUBLIC_NETWORKS.txt").read_text()
    for r in rows:
        if r.network is not None:
            assert r.network in REGISTRY or r.network in VAIC_ONLY_NETWORKS, r.network
        for x in r.vaic_xmodel or ():
            assert x in listed, x


def _write(tmp_path: Path, mutate) -> Path:
    doc = json.loads(published.PUBLISHED.read_text())
    doc["rows"] = doc["rows"][:3]
    mutate(doc["rows"])
    p = tmp_path / "figures.json"
    p.write_text(json.dumps(doc))
    return p


@pytest.mark.parametrize("mutate, says", [
    (lambda rs: rs.append(dict(rs[0])), "the same figure as rows[0]"),
    (lambda rs: rs[1].update(value=-3.0), "value must be a positive number"),
    (lambda rs: rs[2].pop("source"), "fields missing ['source']"),
    (lambda rs: rs[0].update(bound="about right"), "bound 'about right' is not one of"),
    (lambda rs: rs[1].update(dpu_ms_upper=rs[1]["dpu_ms_upper"] * 2), "is not the bound of"),
    (lambda rs: rs[0].update(threads="eight"), "metric/threads"),
])
def test_a_bad_row_is_one_clear_error_naming_it(tmp_path, mutate, says):
    path = _write(tmp_path, mutate)
    with pytest.raises(published.PublishedFiguresError, match=r"rows\[\d\]") as e:
        published.load_published(path)
    assert says in str(e.value) and str(path) in str(e.value)


def test_select_refuses_an_unknown_field(rows):
    with pytest.raises(ValueError, match="no field"):
        published.select(rows, model_name="resnet50")
