"""Custom-IP plugins (Vitis AI's plugin mechanism): claims, compile and runners, the artifact carrying them, a
missing plugin at load, and models without plugins compiling exactly as before."""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import tvm
from hypothesis import given, settings
from hypothesis import strategies as st
from tvm import relax

import tvm_dpu
from tvm_dpu import zoo
from tvm_dpu.errors import ArtifactError
from tvm_dpu.plugins import Plugin, PluginError, get_plugin, register_plugin, use_runner
from tvm_dpu.plugins.softmax_ip import SoftmaxIP, input_fix_point, make_lut

ARCH = "zcu102"


class SigmoidLUT(Plugin):
    """A tiny IP for tests: int8 sigmoid through a 256-entry table, claimed by node name."""

    name = "test_sigmoid"
    device = "sigmoid_ip"
    version = "3"

    def partition(self, graph):
        return graph.filter_by_name("branch_b.sigmoid")

    def float_reference(self, subgraph, inputs):
        return [1.0 / (1.0 + np.exp(-inputs[0]))]

    def compile(self, subgraph, calibration):
        return bytes([4])  # input fix_point

    def ref(self, payload, inputs):
        q = np.clip(np.floor(inputs[0] * 2.0 ** payload[0] + 0.5), -128, 127)
        return [np.round(256.0 / (1.0 + np.exp(-q * 2.0 ** -payload[0]))).astype(np.float32) / 256.0]

    sim = ref


@pytest.fixture(scope="module")
def with_softmax(model, calib):
    return tvm_dpu.build(model, arch=ARCH, calibration=calib, progress=False, plugins=["softmax_ip"])


@pytest.fixture(scope="module")
def plain(model, calib):
    return tvm_dpu.build(model, arch=ARCH, calibration=calib, progress=False)


def test_plugin_claims_exactly_its_ops(with_softmax, plain):
    before = {n.name: n.device for n in plain.partition_report.nodes}
    after = {n.name: n.device for n in with_softmax.partition_report.nodes}
    changed = {k: (before[k], after[k]) for k in before if before[k] != after[k]}
    assert changed == {"head.softmax": ("cpu", "softmax_ip")}
    assert [p["nodes"] for p in with_softmax.plugin_subgraphs] == [["head.softmax"]]
    assert "1 on softmax_ip" in with_softmax.partition_report.summary()


def test_plugins_apply_in_order_and_by_name(model, calib):
    c = tvm_dpu.build(model, arch=ARCH, calibration=calib, progress=False, plugins=[SigmoidLUT, "softmax_ip"])
    devices = {n.name: n.device for n in c.partition_report.nodes}
    assert devices["branch_b.sigmoid"] == "sigmoid_ip" and devices["head.softmax"] == "softmax_ip"
    assert sorted(p["plugin"] for p in c.plugin_subgraphs) == ["softmax_ip", "test_sigmoid"]
    y = c.run(zoo.random_input(model, seed=1))[0]
    assert y.shape == (1, 10) and abs(float(y.sum()) - 1.0) < 2e-3


def test_result_equals_the_plugin_reference(model, with_softmax, plain):
    x = zoo.random_input(model, seed=4)
    with use_runner("ref"):
        ref = with_softmax.run(x)[0]
    sim = with_softmax.run(x)[0]  # default runner on the emulator: the IP's simulator
    np.testing.assert_array_equal(sim, ref)
    # Against float softmax of the same logits (the plain build runs softmax on the CPU in float).
    assert float(np.max(np.abs(sim - plain.run(x)[0]))) < 2e-3


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 3), st.integers(2, 40), st.floats(0.05, 60.0), st.integers(0, 2**31))
def test_softmax_ip_sim_equals_ref_bit_for_bit(rows, channels, scale, seed):
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((rows, channels)) * scale).astype(np.float32)
    ip = SoftmaxIP()
    payload = ip.compile(_softmax_subgraph(channels), [[x]])
    (r,) = ip.ref(payload, [x])
    (s,) = ip.sim(payload, [x])
    np.testing.assert_array_equal(r, s)
    (f,) = ip.float_reference(None, [x])
    # Accuracy bound: each logit is rounded to the int8 step 2^-f (|dp| <= step/4 for softmax), plus the Q15 LUT
    # and output rounding.
    step = 2.0 ** -input_fix_point(float(np.abs(x).max()))
    assert float(np.max(np.abs(r - f))) < step / 4 + 2e-3


def _softmax_subgraph(channels):
    from tvm_dpu.plugins.api import PluginSubgraph, SubgraphOp

    return PluginSubgraph("s", [SubgraphOp("relax.nn.softmax", {"axis": -1}, ["in0"], "t0")], [(1, channels)],
                          [(1, channels)], ["t0"])


def test_softmax_ip_accuracy_vs_float():
    """Against float softmax: on logits already on the int8 grid (what a DPU fc layer hands over) only the LUT and
    Q15 rounding remain; on arbitrary float logits the int8 input rounding (step 2^-f) dominates."""
    rng = np.random.default_rng(0)
    ip = SoftmaxIP()
    grid = (np.clip(np.round(rng.standard_normal((64, 1000)) * 4 * 16), -128, 127) / 16).astype(np.float32)
    free = (rng.standard_normal((64, 1000)) * 4).astype(np.float32)
    for label, x, bound in (("int8-grid logits (fix_point 4)", grid, 2e-3), ("float logits (std 4)", free, 0.07)):
        payload = ip.compile(_softmax_subgraph(1000), [[x]])
        (y,) = ip.ref(payload, [x])
        (f,) = ip.float_reference(None, [x])
        err = np.abs(y - f)
        agree = float(np.mean(y.argmax(1) == f.argmax(1)))
        print(f"softmax_ip vs float softmax, 64x1000 {label}: max |err| {err.max():.2e}, mean {err.mean():.2e}, "
              f"argmax agreement {agree:.3f}")
        assert err.max() < bound
    assert agree > 0.9
    assert input_fix_point(0.0) == 12 and make_lut(4)[0] == 1 << 15


def test_artifact_carries_plugin_subgraphs_and_refuses_missing_plugins(model, calib, tmp_path):
    register_plugin(SigmoidLUT)
    c = tvm_dpu.build(model, arch=ARCH, calibration=calib, progress=False, plugins=["test_sigmoid"])
    path = c.export(tmp_path / "p.tvmdpu")
    x = zoo.random_input(model, seed=2)
    np.testing.assert_array_equal(tvm_dpu.load(path).run(x)[0], c.run(x)[0])
    from tvm_dpu.runtime.artifact import read_header

    header, _ = read_header(path)
    assert [(p["plugin"], p["version"], p["device"]) for p in header["plugin_subgraphs"]] == \
        [("test_sigmoid", "3", "sigmoid_ip")]
    # A fresh process has no 'test_sigmoid' plugin installed: one clear error at load.
    code = f"import tvm_dpu\ntvm_dpu.load({str(path)!r})"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode != 0
    assert "ArtifactError" in out.stderr and "plugin 'test_sigmoid' version 3, which is not installed" in out.stderr
    # Another version installed: refused too.
    get_plugin("test_sigmoid").version = "4"
    try:
        with pytest.raises(ArtifactError, match="version 3; version 4 is installed"):
            tvm_dpu.load(path)
    finally:
        get_plugin("test_sigmoid").version = "3"


def test_models_without_plugins_compile_exactly_as_before(model, calib, plain, tmp_path):
    again = tvm_dpu.build(model, arch=ARCH, calibration=calib, progress=False, plugins=[])
    a = plain.export(tmp_path / "a.tvmdpu")
    b = again.export(tmp_path / "b.tvmdpu")
    assert a.read_bytes() == b.read_bytes()
    assert plain.plugin_subgraphs == []


def test_tvm_native_pipeline_and_fresh_process(model, calib, tmp_path):
    x = zoo.random_input(model, seed=6)
    ex = tvm.compile(tvm_dpu.from_onnx(model), target="dpu",
                     relax_pipeline=relax.get_pipeline("dpu", arch=ARCH, calibration=calib, plugins="softmax_ip"))
    ex.export_library(str(tmp_path / "m.so"))
    y = relax.VirtualMachine(ex, tvm.cpu())["main"](tvm.runtime.tensor(x)).numpy()
    np.save(tmp_path / "x.npy", x)
    code = textwrap.dedent(f"""
        import numpy as np, tvm, tvm_dpu
        from tvm import relax
        lib = tvm.runtime.load_module({str(tmp_path / 'm.so')!r})
        y = relax.VirtualMachine(lib, tvm.cpu())["main"](tvm.runtime.tensor(np.load({str(tmp_path / 'x.npy')!r})))
        np.save({str(tmp_path / 'y.npy')!r}, y.numpy())
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    np.testing.assert_array_equal(np.load(tmp_path / "y.npy"), y)


def test_entry_point_registration(tmp_path, monkeypatch):
    from importlib.metadata import EntryPoint

    import tvm_dpu.plugins.registry as registry

    (tmp_path / "ep_plugin_mod.py").write_text(textwrap.dedent("""
        from tvm_dpu.plugins import Plugin
        class EPPlugin(Plugin):
            name = "ep_plugin"
            def partition(self, graph):
                return []
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    ep = EntryPoint(name="ep_plugin", value="ep_plugin_mod:EPPlugin", group=registry.ENTRY_POINT_GROUP)
    monkeypatch.setattr(registry, "entry_points", lambda group: [ep] if group == registry.ENTRY_POINT_GROUP else [])
    assert "ep_plugin" in registry.available_plugins()
    assert get_plugin("ep_plugin").device == "ep_plugin"


def test_bad_plugins_give_clear_errors(model, calib):
    with pytest.raises(PluginError, match="'nope' is not installed"):
        tvm_dpu.build(model, arch=ARCH, calibration=calib, progress=False, plugins=["nope"])

    class Greedy(SigmoidLUT):
        name = "greedy"

        def partition(self, graph):
            return ["no_such_node"]

    with pytest.raises(PluginError, match="claimed op 'no_such_node', which the model does not have"):
        tvm_dpu.build(model, arch=ARCH, calibration=calib, progress=False, plugins=[Greedy])

    class BadName(SigmoidLUT):
        name = "Bad-Name"

    with pytest.raises(PluginError, match="use lower-case letters"):
        register_plugin(BadName)

    class NotBytes(SigmoidLUT):
        name = "not_bytes"

        def compile(self, subgraph, calibration):
            return {"fp": 4}

    with pytest.raises(PluginError, match="compile must return bytes"):
        tvm_dpu.build(model, arch=ARCH, calibration=calib, progress=False, plugins=[NotBytes])


def test_cli_options_plugins(tmp_path):
    from tvm_dpu.cli import main

    out = tmp_path / "o"
    assert main(["compile", "examples/mixed_cnn.onnx", "--arch", ARCH, "-o", str(out), "--calib",
                 "examples/mixed_cnn_calib.npz", "--options", '{"plugins": "softmax_ip"}', "-q"]) == 0
    meta = json.loads((out / "meta.json").read_text())
    assert [p["device"] for p in meta["plugin_subgraphs"]] == ["softmax_ip"]
    assert main(["run", str(out / "mixed_cnn.tvmdpu"), "--verify"]) == 0


class _Raises(SigmoidLUT):
    """Raises ZeroDivisionError in the stage named by `where`."""

    where = ""

    def partition(self, graph):
        if self.where == "partition":
            raise ZeroDivisionError("bug in partition")
        return super().partition(graph)

    def float_reference(self, subgraph, inputs):
        if self.where == "float_reference":
            raise ZeroDivisionError("bug in float_reference")
        return super().float_reference(subgraph, inputs)

    def compile(self, subgraph, calibration):
        if self.where == "compile":
            raise ZeroDivisionError("bug in compile")
        return super().compile(subgraph, calibration)


@pytest.mark.parametrize("stage", ["partition", "float_reference", "compile"])
def test_plugin_exceptions_name_the_plugin_and_stage(model, calib, stage):
    cls = type(f"Raises_{stage}", (_Raises,), {"name": f"raises_{stage}", "where": stage})
    with pytest.raises(PluginError, match=f"plugin 'raises_{stage}' failed in {stage}: ZeroDivisionError: bug in"):
        tvm_dpu.build(model, arch=ARCH, calibration=calib, progress=False, plugins=[cls])


def test_non_finite_plugin_outputs_are_refused(model, calib):
    class NanRef(SigmoidLUT):
        name = "nan_ref"

        def float_reference(self, subgraph, inputs):
            out = super().float_reference(subgraph, inputs)[0].copy()
            out.flat[0] = np.nan
            return [out]

    with pytest.raises(PluginError, match="plugin 'nan_ref': float_reference output 0 has 1 NaN/Inf"):
        tvm_dpu.build(model, arch=ARCH, calibration=calib, progress=False, plugins=[NanRef])

    class InfRunner(SigmoidLUT):
        name = "inf_runner"

        def ref(self, payload, inputs):
            return [np.full_like(inputs[0], np.inf)]

        sim = ref

    c = tvm_dpu.build(model, arch=ARCH, calibration=calib, progress=False, plugins=[InfRunner])
    with pytest.raises(PluginError, match="plugin 'inf_runner': runner 'sim' of partition .* NaN/Inf"):
        c.run(calib[0])


def test_a_broken_entry_point_plugin_is_one_clear_error(tmp_path, monkeypatch):
    from importlib.metadata import EntryPoint

    import tvm_dpu.plugins.registry as registry

    (tmp_path / "broken_plugin_mod.py").write_text("raise ImportError('missing dependency of the plugin')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    ep = EntryPoint(name="broken", value="broken_plugin_mod:P", group=registry.ENTRY_POINT_GROUP)
    monkeypatch.setattr(registry, "entry_points", lambda group: [ep] if group == registry.ENTRY_POINT_GROUP else [])
    with pytest.raises(PluginError, match="plugin 'broken' .* failed to load: ImportError: missing dependency"):
        get_plugin("broken")
