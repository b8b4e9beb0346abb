"""Calibration: bounded deterministic statistics, MSE vs min-max fix_point choice, progress bar, bad input."""
from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from tvm_dpu.errors import QuantizationError
from hypothesis import given, settings
from hypothesis import strategies as st

import tvm_dpu.quant.calibration as calibration
from tvm_dpu.quant.calibration import (
    SEARCH_SPAN,
    CalibrationStats,
    TensorStats,
    choose_fix_point,
    collect_stats,
    minmax_fix_point,
    quant_mse,
    quantize_counting,
    quantize_values,
    saturated_count,
    search_fix_point,
    sqnr_db,
)
from tvm_dpu.xgraph import Graph, Op, Tensor


def _graph(two_inputs: bool = False) -> Graph:
    rng = np.random.default_rng(1)
    g = Graph("cal")
    g.add_tensor(Tensor("x", (1, 2, 6, 6), "float32"))
    g.inputs = ["x"]
    w = (rng.standard_normal((4, 2, 3, 3)) * 0.5).astype(np.float32)
    g.add_tensor(Tensor("w", w.shape, "float32", None, w))
    g.add_tensor(Tensor("c", (1, 4, 6, 6), "float32"))
    g.add_op(Op("conv", "conv2d", ["x"], ["c"], {"pads": [1, 1, 1, 1], "act": "relu"}, {"weights": "w"}))
    g.add_tensor(Tensor("p", (1, 4, 3, 3), "float32"))
    g.add_op(Op("pool", "max_pool2d", ["c"], ["p"], {"kernel": [2, 2], "strides": [2, 2]}))
    g.outputs = ["p"]
    if two_inputs:
        g.add_tensor(Tensor("z", (1, 4, 3, 3), "float32"))
        g.inputs.append("z")
        g.add_tensor(Tensor("s", (1, 4, 3, 3), "float32"))
        g.add_op(Op("add", "eltwise_add", ["p", "z"], ["s"]))
        g.outputs = ["s"]
    return g


def _batches(n: int, seed: int = 0, shape=(2, 2, 6, 6)):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(shape) * 3 for _ in range(n)]


# -- fix_point choice ---------------------------------------------------------------------------------
def test_minmax_fix_point_is_largest_without_saturation():
    for amax in [0.01, 0.3, 0.9999, 1.0, 1.7, 5.0, 127.0, 300.0]:
        fp = minmax_fix_point(-amax, amax)
        assert np.floor(amax * 2.0 ** fp + 0.5) <= 127 and np.floor(-amax * 2.0 ** fp + 0.5) >= -128
        assert np.floor(amax * 2.0 ** (fp + 1) + 0.5) > 127
    assert minmax_fix_point(-1.0, 0.5) == 7  # -1.0 * 128 = -128 still fits
    assert minmax_fix_point(0.0, 0.0, default=3) == 3


@pytest.mark.parametrize("amax,expected", [(1.0, 7), (4.0, 5), (0.25, 9), (32.0, 2)])
def test_uniform_data_gets_the_obvious_fix_point(amax, expected):
    x = np.random.default_rng(0).uniform(-amax, amax, 100_000)
    assert choose_fix_point(x, "mse") == expected
    # min-max must step down once: amax * 2**expected rounds to 128, which saturates.
    assert choose_fix_point(x, "minmax") == expected - 1


@pytest.mark.parametrize("dist", ["laplace", "student_t", "outliers"])
def test_mse_beats_minmax_on_heavy_tails(dist):
    rng = np.random.default_rng(3)
    if dist == "laplace":
        x = rng.laplace(0, 0.5, 200_000)
    elif dist == "student_t":
        x = rng.standard_t(2, 200_000)
    else:
        x = np.concatenate([rng.standard_normal(200_000) * 0.2, [40.0, -35.0]])
    fp_mse, fp_mm = choose_fix_point(x, "mse"), choose_fix_point(x, "minmax")
    assert quant_mse(x, fp_mse) <= quant_mse(x, fp_mm)
    assert fp_mse > fp_mm  # on these tails clipping a few values pays
    if dist == "outliers":  # two far outliers: min-max spends the range on them
        assert quant_mse(x, fp_mse) < 0.5 * quant_mse(x, fp_mm)
    # and it is the best of its neighbours
    assert quant_mse(x, fp_mse) <= min(quant_mse(x, fp_mse - 1), quant_mse(x, fp_mse + 1))


def test_bad_method_and_non_finite():
    with pytest.raises(QuantizationError, match="unknown fix_point method 'kl'"):
        choose_fix_point(np.ones(3), "kl")
    with pytest.raises(QuantizationError, match="NaN"):
        choose_fix_point(np.array([1.0, np.nan]))


def _exhaustive_fix_point(x: np.ndarray, vmin: float, vmax: float) -> int:
    """The MSE choice computed on every candidate (the search before it stopped early), ties to the smaller fp."""
    fps = list(range(minmax_fix_point(vmin, vmax), minmax_fix_point(vmin, vmax) + SEARCH_SPAN + 1))
    errs = [quant_mse(x, fp) for fp in fps]
    return fps[min(range(len(fps)), key=lambda j: (errs[j], j))]


def _values(kind: str, seed: int, size: int, scale: float) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if kind == "normal":
        x = rng.standard_normal(size)
    elif kind == "laplace":
        x = rng.laplace(0, 1, size)
    elif kind == "student_t":
        x = rng.standard_t(1.5, size)
    elif kind == "relu":
        x = np.maximum(rng.standard_normal(size), 0)
    elif kind == "outliers":
        x = rng.standard_normal(size) * 0.05
        x[rng.integers(0, size, 3)] = rng.choice([-1, 1], 3) * rng.uniform(5, 50, 3)
    else:  # on the int8 grid of some fp: several candidates are exact (error 0), a tie the smaller fp wins
        x = rng.integers(-128, 128, size) * 2.0 ** -int(rng.integers(0, 6))
    return (x * scale).astype(np.float32)


@settings(max_examples=150, deadline=None)
@given(st.sampled_from(["normal", "laplace", "student_t", "relu", "outliers", "grid"]),
       st.integers(0, 2**31), st.integers(1, 3000), st.sampled_from([1e-3, 0.07, 1.0, 30.0]), st.booleans())
def test_pruned_mse_search_chooses_what_the_exhaustive_one_does(kind, seed, size, scale, chunked):
    # The search stops once a candidate's saturation error alone exceeds the best error so far; the errors it
    # compares are computed as before, so the choice must be the exhaustive one on any data (fix points decide
    # artifacts). `chunked` runs the multi-chunk path of tensors larger than CHUNK.
    x = _values(kind, seed, size, scale)
    vmin, vmax = float(x.min()), float(x.max())
    with pytest.MonkeyPatch.context() as mp:
        if chunked:
            mp.setattr(calibration, "CHUNK", 257)
        found = search_fix_point(x, vmin=vmin, vmax=vmax)
        if vmin == vmax == 0.0:  # all zero: the default fp, nothing searched
            assert (found.fix_point, found.mse) == (calibration.ZERO_FIX_POINT, {})
            return
        assert found.fix_point == _exhaustive_fix_point(x, vmin, vmax)
        assert found.fix_point in found.mse
        for fp, err in found.mse.items():  # the errors it reports are quant_mse's, bit for bit
            assert err == quant_mse(x, fp)
        assert sqnr_db(x, found.fix_point, found.mse[found.fix_point]) == sqnr_db(x, found.fix_point)


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(["normal", "student_t", "outliers", "grid"]), st.integers(0, 2**31), st.integers(1, 2000))
def test_clipped_mse_is_a_lower_bound_growing_with_fp(kind, seed, size):
    x = _values(kind, seed, size, 1.0)
    base = minmax_fix_point(float(x.min()), float(x.max()))
    bounds = [calibration._clipped_mse(x, fp) for fp in range(base, base + SEARCH_SPAN + 1)]
    assert bounds[0] == 0.0  # the min-max fp saturates nothing
    for fp, b in zip(range(base, base + SEARCH_SPAN + 1), bounds):
        assert b <= quant_mse(x, fp) * (1 + 1e-12)
    assert all(a <= b * (1 + 1e-12) for a, b in zip(bounds, bounds[1:]))


def test_quantize_counting_is_values_and_saturation_in_one_pass(monkeypatch):
    monkeypatch.setattr(calibration, "CHUNK", 100)
    x = np.random.default_rng(2).standard_normal(1234).astype(np.float32) * 3
    for fp in (5, 6, 7):
        q, n = quantize_counting(x, fp)
        r = np.floor(x.astype(np.float64) * 2.0 ** fp + 0.5)
        np.testing.assert_array_equal(q, np.clip(r, -128, 127).astype(np.int8))
        np.testing.assert_array_equal(q, quantize_values(x, fp))
        assert n == saturated_count(x, fp) == int(np.count_nonzero((r < -128) | (r > 127))) > 0


# -- reservoir -----------------------------------------------------------------------------------------
def test_reservoir_bounded_exact_range_and_uniform():
    s = TensorStats("t", capacity=1000, seed=0)
    for i in range(50):
        s.add(np.arange(i * 400, (i + 1) * 400, dtype=np.float64))
    assert s.count == 20_000 and s.samples.size == 1000
    assert (s.min, s.max) == (0.0, 19_999.0)
    assert len(np.unique(s.samples)) == 1000  # distinct values: no slot duplicated
    # a uniform sample of 0..19999: each quarter holds about a quarter of it
    quarters = np.histogram(s.samples, bins=4, range=(0, 20_000))[0]
    assert np.all(np.abs(quarters - 250) < 60), quarters


def test_reservoir_is_algorithm_r_value_by_value():
    # The vectorised add keeps exactly what the serial algorithm R keeps with the same random stream (slot =
    # floor(u * seen), kept when below the capacity): statistics, fix points and artifacts depend on it.
    import zlib

    cap, seed = 64, 7
    s = TensorStats("fm", capacity=cap, seed=seed)
    data = [np.random.default_rng(i).normal(size=n) for i, n in enumerate((50, 1, 300, 2000, 17))]
    for d in data:
        s.add(d)
    rng = np.random.default_rng([seed, zlib.crc32(b"fm")])
    ref: list[float] = []
    seen = 0
    for v in np.concatenate(data).astype(np.float32):
        seen += 1
        if len(ref) < cap:
            ref.append(v)
            continue
        slot = int(np.floor(rng.random() * seen))
        if slot < cap:
            ref[slot] = v
    np.testing.assert_array_equal(s.samples, np.array(ref, np.float32))


def test_collect_stats_deterministic_and_bounded():
    g = _graph()
    a = collect_stats(g, _batches(4), progress=False, max_samples=100)
    b = collect_stats(g, _batches(4), progress=False, max_samples=100)
    assert set(a.tensors) == {"x", "c", "p"}
    for n in a.tensors:
        np.testing.assert_array_equal(a[n].samples, b[n].samples)
        assert a[n].samples.size == 100
    assert a.batches == 4 and a.samples == 8
    assert a["x"].count == 4 * 2 * 2 * 36
    assert a["c"].min >= 0.0  # relu output
    c = collect_stats(g, _batches(4), progress=False, max_samples=100, seed=5)
    assert not np.array_equal(a["c"].samples, c["c"].samples)
    assert a.fix_points() == b.fix_points()


def test_collect_stats_folds_like_the_sequential_reservoir():
    # The feature maps of a batch are folded on several threads; each tensor's statistics must be those of
    # folding its values in batch order on one thread.
    from tvm_dpu.xgraph.float_ref import run_graph_float

    g = _graph(two_inputs=True)
    rng = np.random.default_rng(4)
    batches = [{"x": rng.standard_normal((1, 2, 6, 6)), "z": rng.standard_normal((1, 4, 3, 3))} for _ in range(5)]
    got = collect_stats(g, batches, progress=False, max_samples=50, seed=3)
    want = {n: TensorStats(n, 50, 3) for n in got.tensors}
    for b in batches:
        env = run_graph_float(g, b, keep_all=True)
        for n, t in want.items():
            t.add(env[n])
    for n, t in want.items():
        assert (got[n].count, got[n].min, got[n].max) == (t.count, t.min, t.max)
        np.testing.assert_array_equal(got[n].samples, t.samples)


def test_collect_stats_accepts_dicts_generators_and_unbatched_samples():
    g = _graph(two_inputs=True)
    rng = np.random.default_rng(0)
    gen = ({"x": rng.standard_normal((2, 6, 6)), "z": rng.standard_normal((1, 4, 3, 3))} for _ in range(3))
    st = collect_stats(g, gen, progress=False)
    assert st.batches == 3 and "s" in st
    with pytest.raises(QuantizationError, match="batch 0.*inputs \\['x', 'z'\\]"):
        collect_stats(g, [rng.standard_normal((1, 2, 6, 6))], progress=False)
    with pytest.raises(QuantizationError, match="batch 0: .*feed 'x' has shape"):
        collect_stats(g, [{"x": np.zeros((1, 3, 6, 6)), "z": np.zeros((1, 4, 3, 3))}], progress=False)


def test_empty_iterable_is_a_clear_error():
    with pytest.raises(QuantizationError, match="batch iterable is empty"):
        collect_stats(_graph(), [], progress=False)
    with pytest.raises(QuantizationError, match="batch iterable is empty"):
        collect_stats(_graph(), iter(()), progress=True)


def test_missing_tensor_is_named():
    st = CalibrationStats("cal")
    with pytest.raises(QuantizationError, match="tensor 'nope' of graph 'cal'"):
        st["nope"]


def test_progress_bar_on_and_off(capsys, monkeypatch):
    g = _graph()
    collect_stats(g, _batches(3), progress=False)
    assert capsys.readouterr().err == ""
    monkeypatch.setenv("TVM_DPU_PROGRESS", "1")  # captured stderr is no terminal: force the bar
    collect_stats(g, _batches(3), progress=True)
    err = capsys.readouterr().err
    assert "calibrating cal" in err and "3/3" in err
    monkeypatch.setenv("TVM_DPU_PROGRESS", "0")
    collect_stats(g, _batches(3), progress=True)
    assert capsys.readouterr().err == ""


def test_progress_bar_without_a_tty(tmp_path):
    """stdout and stderr redirected to files (no tty): no bar is drawn into the log (its carriage-return redraws
    would fill it), and the package-level `calibrate` is the one-call function even when the statistics module
    was imported first."""
    script = (
        "import numpy as np\n"
        "import tvm_dpu.quant.calibration\n"
        "import tvm_dpu.quant as q\n"
        "from test_calibrate import _graph, _batches\n"
        "g = q.calibrate(_graph(), _batches(2), progress=True)\n"
        "from tvm_dpu.quant.quantize import calibrate as one_call\n"
        "print(g.tensors['p'].dtype, q.calibrate is one_call)\n"
    )
    out, err = tmp_path / "out.txt", tmp_path / "err.txt"
    with open(out, "w") as fo, open(err, "w") as fe:
        rc = subprocess.run([sys.executable, "-c", script], stdout=fo, stderr=fe, stdin=subprocess.DEVNULL,
                            cwd=str(__import__("pathlib").Path(__file__).parent), timeout=120).returncode
    assert rc == 0, err.read_text()
    assert out.read_text().split() == ["int8", "True"]
    assert "2/2" not in err.read_text() and "\r" not in err.read_text()
