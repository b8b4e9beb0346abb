"""Running vai_c .xmodel files: tvm_dpu.load dispatch, DPU subgraphs on the emulator, XIR CPU ops on the host,
custom op types from plugins, and the CLI's inspect / run / report on .xmodel files."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import tvm_dpu
from tvm_dpu.cli import main
from tvm_dpu.errors import XModelError
from tvm_dpu.plugins import Plugin, registry
from tvm_dpu.xmodel import read_xmodel
from tvm_dpu.xmodel.cpu_ops import quantize, run_cpu_op
from tvm_dpu.xmodel.model import XOp, XTensor
from tvm_dpu.xmodel.runner import XModelRunner, load_xmodel, tensor_view

DATA = Path(__file__).parent / "data" / "xmodel"
FILES = sorted(DATA.glob("*.xmodel"))
V25 = DATA / "tf2_custom_op_vai2.5_isa1.xmodel"


def _image(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).uniform(-40, 40, (1, 28, 28, 1)).astype(np.float32)


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_load_dispatches_on_suffix_and_runs_to_end(path):
    m = tvm_dpu.load(path)
    assert isinstance(m, XModelRunner)
    assert [(s.name, s.shape) for s in m.inputs] == [("input_1", (1, 28, 28, 1))]
    (out,) = m.run(_image(0))
    assert out.shape == (1, 10) and out.dtype == np.float32
    # hard sigmoid output with fix_point 7: multiples of 2**-7 in [0, 1)
    assert np.all(out * 128 == np.round(out * 128)) and 0 <= out.min() and out.max() < 1
    assert all(st.ended for st in m.last_stats.values()) and len(m.last_stats) == 2


def test_two_vai_c_releases_compute_the_same_int8_outputs():
    a, b = (load_xmodel(p) for p in FILES)
    for seed in range(3):
        va = a.run_values({"input_1": _image(seed)})
        vb = b.run_values({"input_1": _image(seed)})
        # the first DPU subgraph's output (vai_c 3.0 renamed the op: quant_max_pooling2d_1 -> ..._1_fix)
        first_a, first_b = (next(iter(r.programs.values())).sub.outputs[0].op for r in (a, b))
        assert va[first_a].dtype == np.int8 and va[first_a].std() > 0
        np.testing.assert_array_equal(va[first_a], vb[first_b])
        np.testing.assert_array_equal(a.run(_image(seed))[0], b.run(_image(seed))[0])


def test_inputs_are_quantized_with_dpu_rounding():
    m = load_xmodel(V25)  # input fix_point -2: q = floor(x / 4 + 0.5), saturated
    x = np.full((1, 28, 28, 1), 6.0, np.float32)
    x[0, 0, 0, 0], x[0, 0, 1, 0], x[0, 0, 2, 0], x[0, 0, 3, 0] = -6.0, 1000.0, -2.0, 2.0
    q = m.run_values({"input_1": x})["input_1"]
    assert q.dtype == np.int8 and q[0, 0, :5, 0].tolist() == [-1, 127, 0, 1, 2]


def test_subgraphs_run_in_topological_order_whatever_the_file_order():
    model = read_xmodel(V25)
    expected = load_xmodel(model).run(_image(1))[0]
    model.root.children.reverse()
    runner = load_xmodel(model)
    assert [s.device for s in runner.order] == ["USER", "DPU", "CPU", "DPU", "CPU"]
    np.testing.assert_array_equal(runner.run(_image(1))[0], expected)


def test_unknown_cpu_op_type_is_one_clear_error():
    model = read_xmodel(V25)
    model.op("custom_layer").type = "NoSuchOp"
    with pytest.raises(XModelError, match="CPU op 'custom_layer' has type 'NoSuchOp'.*plugin"):
        load_xmodel(model).run(_image(0))


class _TestPrelu(Plugin):
    """A test plugin supplying an XIR op type; PReLU written as Vitis AI's reference loop does it."""
    name = "xm_test_prelu"
    cpu_ops = ("XmTestPrelu",)
    calls: list = []

    def cpu(self, op_type, name, attrs, inputs, output_shape):
        self.calls.append((op_type, name, [a.shape for a in inputs], output_shape))
        x, alpha = (np.asarray(a, np.float32).reshape(-1) for a in inputs)
        out = np.empty_like(x)
        for i in range(x.size):
            out[i] = x[i] if x[i] >= 0 else x[i] * alpha[i % alpha.size]
        return out.reshape(output_shape)


class _Broken(Plugin):
    name = "xm_test_broken"
    cpu_ops = ("XmBroken",)

    def cpu(self, op_type, name, attrs, inputs, output_shape):
        raise ValueError("boom")


def test_a_plugin_supplies_a_custom_xir_op(monkeypatch):
    plugin = _TestPrelu()
    monkeypatch.setitem(registry._REGISTRY, plugin.name, plugin)
    shipped = load_xmodel(V25)  # Mylayer from the shipped vitis_mylayer plugin
    model = read_xmodel(V25)
    model.op("custom_layer").type = "XmTestPrelu"
    runner = load_xmodel(model)
    for seed in range(2):
        got = runner.run_values({"input_1": _image(seed)})
        want = shipped.run_values({"input_1": _image(seed)})
        x = got["quant_max_pooling2d_1_fix_custom_layer"]
        assert (x < 0).any() and (x > 0).any()  # both branches of the PReLU are exercised
        np.testing.assert_array_equal(got["custom_layer"], want["custom_layer"])
        np.testing.assert_array_equal(runner.run(_image(seed))[0], shipped.run(_image(seed))[0])
    assert plugin.calls[0] == ("XmTestPrelu", "custom_layer", [(1, 2, 2, 64), (2, 2, 64)], (1, 2, 2, 64))


def test_a_failing_plugin_is_named(monkeypatch):
    monkeypatch.setitem(registry._REGISTRY, "xm_test_broken", _Broken())
    model = read_xmodel(V25)
    model.op("custom_layer").type = "XmBroken"
    with pytest.raises(XModelError, match="plugin 'xm_test_broken' failed computing XmBroken op 'custom_layer'"):
        load_xmodel(model).run(_image(0))


def test_isa0_and_foreign_devices_are_refused():
    model = read_xmodel(V25)
    for sg in model.subgraphs("DPU"):
        sg.attrs["dpu_fingerprint"] = 0x01000020F6014407  # Vitis AI 1.4's ISA0 build of the same example
    with pytest.raises(XModelError, match="DPUCZDX8G_ISA0_B4096: tvm-dpu has no instruction table for DPUCZDX8G ISA0"):
        load_xmodel(model)
    from tvm_dpu.arch import load_arch
    from tvm_dpu.runtime.device import EmulatorDevice

    with pytest.raises(XModelError, match="the device has"):
        load_xmodel(V25, device=EmulatorDevice(load_arch("DPUCZDX8G_ISA1_B1024")))
    with pytest.raises(XModelError, match="expected 'emulator', 'pynq'"):
        load_xmodel(V25, device="gpu")


def test_tensor_view_checks_the_region_bounds():
    t = XTensor("t", (1, 2, 2, 4), "xint8", 0, 2, 8, (16, 8, 4, 1), 1)
    region = np.zeros(24, np.uint8)
    tensor_view(region, t, "here")[...] = np.arange(16, dtype=np.int8).reshape(1, 2, 2, 4)
    assert region[8:24].view(np.int8).tolist() == list(range(16))
    with pytest.raises(XModelError, match="ends at byte 25, past REG_2's 24 bytes"):
        tensor_view(region, XTensor("t", (1, 2, 2, 4), "xint8", 0, 2, 9, (16, 8, 4, 1), 1), "here")


def _op(type_: str, shape, attrs=None, fix_point=None) -> XOp:
    return XOp("op", type_, attrs or {}, {"input": []}, XTensor("t", tuple(shape), "float32", fix_point, None, None,
                                                                  None, None))


def test_hard_sigmoid_fix_on_the_host_is_the_dpus():
    """XIR's hard-sigmoid-fix (vai_c leaves it on the CPU for DPUCAHX8H): min(2**32, max(0, 2731 x + 3 * 2731 *
    2**hsigmoid_in)) / 2**shift_hsigmoid, rounded in quant_out_round_mode; with DPU_ROUND (1) it is the golden
    reference's ALU hard sigmoid for every int8 input."""
    from tvm_dpu.quant.rules import HSigmoidQuant
    from tvm_dpu.xgraph.golden_misc import hsigmoid

    model = read_xmodel(V25)
    x = np.arange(-128, 128, dtype=np.int8).reshape(1, 256)
    attrs = {"hsigmoid_in": 2, "shift_hsigmoid": 9, "quant_out_round_mode": 1}
    got = run_cpu_op(_op("hard-sigmoid-fix", (1, 256), attrs), [x], model)
    np.testing.assert_array_equal(got, hsigmoid(x, HSigmoidQuant(2, 9)))
    assert got.dtype == np.int8 and got.min() == 0 and got.max() == 127 and got[0, 128] == 64  # x = 0: 0.5 * 128
    # x = -11 (-2.75): 2731 * 1 / 512 = 5.33 -> 5; x = 25 (6.25): saturates at 127
    assert got[0, 128 - 11] == 5 and got[0, 128 + 25] == 127
    odd = {"hsigmoid_in": 0, "shift_hsigmoid": 13, "quant_out_round_mode": 2}  # 3 * 2731 / 8192 = 1.0001 -> 1
    assert run_cpu_op(_op("hard-sigmoid-fix", (1, 1), odd), [np.zeros((1, 1), np.int8)], model).item() == 1
    with pytest.raises(XModelError, match="quant_out_round_mode 7 is not one of"):
        run_cpu_op(_op("hard-sigmoid-fix", (1, 1), {**odd, "quant_out_round_mode": 7}),
                   [np.zeros((1, 1), np.int8)], model)


def test_cpu_ops_against_hand_values():
    model = read_xmodel(V25)
    x = np.array([[-1.5, -0.5, 0.5, 1.5, 2.25, 100.0]], np.float32)
    half = {"fix_point": 1}
    assert quantize(x, 1, "DPU_ROUND").tolist() == [[-3, -1, 1, 3, 5, 127]]
    assert quantize(x * 0.5, 1, "DPU_ROUND").tolist() == [[-1, 0, 1, 2, 2, 100]]  # halves toward +inf
    assert quantize(x * 0.5, 1, "PY3_ROUND").tolist() == [[-2, 0, 0, 2, 2, 100]]  # halves to even
    assert quantize(x * 0.5, 1, "STD_ROUND").tolist() == [[-2, -1, 1, 2, 2, 100]]  # halves away from zero
    q = run_cpu_op(_op("float2fix", (1, 6), half), [x], model)
    assert q.dtype == np.int8 and q.tolist() == [[-3, -1, 1, 3, 5, 127]]
    assert run_cpu_op(_op("fix2float", (1, 6), half), [q], model).tolist() == [[-1.5, -0.5, 0.5, 1.5, 2.5, 63.5]]
    assert run_cpu_op(_op("fix", (1, 6), half), [x], model).tolist() == [[-1.5, -0.5, 0.5, 1.5, 2.5, 63.5]]
    a = np.arange(6, dtype=np.float32).reshape(1, 2, 3)
    assert run_cpu_op(_op("transpose", (1, 3, 2), {"order": [0, 2, 1]}), [a], model).tolist() == \
        [[[0, 3], [1, 4], [2, 5]]]
    assert run_cpu_op(_op("concat", (1, 4, 3), {"axis": 1}), [a, a], model).shape == (1, 4, 3)
    assert run_cpu_op(_op("flatten", (1, 6)), [a], model).tolist() == [[0, 1, 2, 3, 4, 5]]
    s = run_cpu_op(_op("softmax", (1, 2, 3), {"axis": -1}), [a], model)
    np.testing.assert_allclose(s[0, 0], np.exp([0, 1, 2]) / np.exp([0, 1, 2]).sum(), rtol=1e-6)
    c = run_cpu_op(_op("const", (2,), {"data": np.array([0.5, -2], np.float32).tobytes(), "data_type": "float32"}),
                   [], model)
    assert c.tolist() == [0.5, -2.0]
    with pytest.raises(XModelError, match="holds 4 bytes for 2"):
        run_cpu_op(_op("const", (2,), {"data": b"\0" * 4, "data_type": "float32"}), [], model)


def test_cli_inspect_lists_the_subgraph_tree(capsys):
    assert main(["inspect", str(V25), "--disasm"]) == 0
    out = capsys.readouterr().out
    assert "subgraph_quant_conv2d [DPU] DPUCZDX8G_ISA1_B4096 fingerprint 0x0101000016010407: 185 instructions" in out
    assert "subgraph_custom_layer [CPU] ops: quant_max_pooling2d_1_fix_custom_layer" in out
    assert "conv2d-fix         quant_conv2d  -> [1, 22, 22, 32] xint8 fix_point 5 REG_1@0" in out
    assert "input  quant_input_1_upload_0: shape [1, 28, 28, 1], fix_point -2, REG_2 ddr_addr 0" in out
    assert out.count(" END ") + out.count(" END\n") >= 2  # a listing per DPU subgraph


def test_cli_run_writes_outputs(tmp_path, capsys):
    x = _image(3)
    np.savez(tmp_path / "x.npz", input_1=x)
    assert main(["run", str(V25), "--input", str(tmp_path / "x.npz"), "-o", str(tmp_path / "y.npz")]) == 0
    np.testing.assert_array_equal(np.load(tmp_path / "y.npz")[load_xmodel(V25).outputs[0].name], load_xmodel(V25).run(x)[0])


def test_cli_report_names_why_there_is_no_timing(tmp_path, capsys):
    out = tmp_path / "r.html"
    assert main(["report", str(V25), "-o", str(out)]) == 0
    page = out.read_text()
    assert "DPUCZDX8G_ISA1_B4096" in page and "subgraph_quant_conv2d" in page
    printed = capsys.readouterr().out
    assert "2 DPU subgraph(s) of vai_c code" in printed
    # either cycles or the timing model's reason, per subgraph: never a traceback
    assert printed.count("cycles") + printed.count("timing model failed") >= 2


def test_runs_through_the_pynq_driver_on_a_simulated_board():
    """The register-level path (page-aligned buffers, base-address registers, start/poll) on the simulated pynq
    board, whose fingerprint is the arch vai_c 3.0 compiled for: same outputs as the emulator device."""
    from tvm_dpu.arch import load_arch
    from tvm_dpu.runtime.pynq_driver import PynqDevice
    from tvm_dpu.runtime.sim_regfile import SimulatedPynq

    path = DATA / "tf2_custom_op_vai3.0_isa1.xmodel"
    arch = load_arch(read_xmodel(path).dpu_subgraphs()[0].fingerprint)
    board = load_xmodel(path, device=PynqDevice(bitfile="dpu.bit", pynq=SimulatedPynq(arch)))
    emulated = load_xmodel(path)
    for seed in range(2):
        np.testing.assert_array_equal(board.run(_image(seed))[0], emulated.run(_image(seed))[0])
