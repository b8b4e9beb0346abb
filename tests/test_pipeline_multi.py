"""Pipelines of models with several DPU subgraphs and CPU ops between them (tvm_dpu.pipeline.multi), on the bundled
mixed_cnn example (two DPU subgraphs; a 17x17 conv, a Sigmoid, a ReLU and the Softmax on the CPU): every stage
count bit-identical to the unsplit model with frames in order, saved and loaded, the CPU cost hook, the CLI."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import tvm_dpu
from tvm_dpu.pipeline import PlanError
from tvm_dpu.pipeline.model import PipelineModel, boards_for
from tvm_dpu.pipeline.multi import cpu_op_seconds, model_steps, plan_steps, step_chain
from tvm_dpu.pipeline.plan import load_link

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


@pytest.fixture(scope="module")
def frames():
    return [np.asarray(x)[None] for x in np.load(EXAMPLES / "mixed_cnn_calib.npz")["input"][:6]]


@pytest.fixture(scope="module")
def single(frames):
    return tvm_dpu.build(str(EXAMPLES / "mixed_cnn.onnx"), arch="zcu102", calibration=frames[:2], progress=False)


@pytest.fixture(scope="module")
def reference(single, frames):
    return [single.run(x) for x in frames]


def _same(a, b):
    return len(a) == len(b) and all(np.array_equal(x, y) for x, y in zip(a, b))


def test_the_example_has_several_dpu_subgraphs_and_cpu_steps(single):
    steps = model_steps(single)
    assert len(single.runners) == 2 and len(steps.runners) == 2
    kinds = ["cpu" if s.graph_index is None else f"sg{s.graph_index}" for s in steps.steps]
    assert kinds[0] == "sg0" and kinds[-1] == "cpu" and "cpu" in kinds[kinds.index("sg1") - 1:]
    # the CPU ops sit between the subgraphs: sg0 ... cpu ... sg1 ... cpu
    assert kinds.index("sg1") > max(i for i, k in enumerate(kinds) if k == "sg0") + 1


@pytest.mark.parametrize("boards", ["zcu102", "zcu102,ultra96,zcu102"])
def test_pipelined_bit_identical_and_in_order(single, frames, reference, boards):
    pipe = PipelineModel.from_model(single, boards_for(boards))
    steps = model_steps(single)
    ops = [op for st in pipe.stages for op in st.spec.ops]
    assert ops == [s.name for s in steps.steps]  # every step once, in order
    for a, b in zip(pipe.stages, pipe.stages[1:]):
        assert a.spec.outputs == b.spec.inputs
        assert all(steps.shape_of[k] is not None for k in a.spec.outputs)  # only tensors cross
    outs = list(pipe.run_stream(frames, max_in_flight=3))
    assert len(outs) == len(frames) and all(_same(g, r) for g, r in zip(outs, reference))
    pipe.close()


def test_four_boards_with_a_cpu_only_stage_saved_and_loaded(single, frames, reference, tmp_path):
    pipe = PipelineModel.from_model(single, boards=4)
    cpu_only = [st for st in pipe.stages if all(op.startswith("cpu:") for op in st.spec.ops)]
    assert cpu_only and not cpu_only[0].model.runners  # the 17x17 conv alone on a board's ARM cores
    mixed = [st for st in pipe.stages if {op[:3] for op in st.spec.ops} >= {"cpu", "sg0"}]
    assert mixed  # a stage runs DPU and CPU work
    # A DPU output crosses as int8 with its fix point; a CPU result as float32.
    sent = {k: fp for st in pipe.stages for k, fp in st.spec.wire_fix_points.items()}
    assert sent and all(isinstance(fp, int) for fp in sent.values())
    loaded = PipelineModel.load(pipe.save(tmp_path))
    outs = list(loaded.run_stream(frames, max_in_flight=2))
    assert all(_same(g, r) for g, r in zip(outs, reference))
    loaded.close()


def test_cpu_steps_are_costed_by_the_host_cost_model(single):
    from tvm_dpu.timing.host import load_host_cost

    cost = load_host_cost()
    assert cost.cpu_s_per_mac > 0  # measured (bench_host.py): TVM-compiled conv2d / matmul
    boards = boards_for("zcu102", 2)
    steps = model_steps(single)
    big = next(s for s in steps.steps if s.graph_index is None and "conv2d" in str(getattr(s.binding.value, "op", "")))
    # the 17x17 conv: 16x16x16 outputs x 16x17x17 MACs each, on the host cost model's per-op, per-element and
    # per-MAC terms (one cost model for every host figure)
    outs, macs = 16 * 16 * 16, 16 * 16 * 16 * 16 * 17 * 17
    assert cpu_op_seconds(big.binding, cost) == pytest.approx(
        cost.cpu_fixed_s + cost.cpu_s_per_elem * outs + cost.cpu_s_per_mac * macs)
    assert cpu_op_seconds(big.binding, cost.scaled(3.0)) == pytest.approx(3 * cpu_op_seconds(big.binding, cost))
    seen = []

    def free(binding):
        seen.append(binding)
        return 0.0

    chain = step_chain(single, boards, cpu_cost=free)
    assert len(seen) == sum(1 for s in steps.steps if s.graph_index is None)
    cpu = [c for c, s in zip(chain, steps.steps) if s.graph_index is None]
    assert all(c.seconds["zcu102"] == 0.0 and c.host_seconds == 0.0 for c in cpu)
    costed_chain = step_chain(single, boards)  # CPU steps are host time, not DPU time
    assert any(c.host_seconds > 0 for c in costed_chain)
    assert all(c.seconds["zcu102"] == 0.0 for c, s in zip(costed_chain, steps.steps) if s.graph_index is None)
    link = load_link("serial-8.5g")
    costed = plan_steps(single, boards, link)
    free_plan = plan_steps(single, boards, link, cpu_cost=free)
    bare = plan_steps(single, boards, link, cpu_cost=free, host_cost=None)
    assert costed.bottleneck_s > free_plan.bottleneck_s > bare.bottleneck_s  # CPU steps, then the stages' host
    assert costed.bottleneck_s >= cpu_op_seconds(big.binding, cost)
    assert all(s.host_s > 0 for s in costed.stages) and all(s.host_s == 0 for s in bare.stages)


def test_a_model_without_its_relax_module_is_refused(single):
    import dataclasses

    with pytest.raises(PlanError, match="needs its Relax module"):
        model_steps(dataclasses.replace(single, relax_module=None))


def test_cli_pipelines_the_bundled_example(tmp_path, capsys):
    from tvm_dpu.cli import main

    out = tmp_path / "out"
    assert main(["pipeline", str(EXAMPLES / "mixed_cnn.onnx"), "--arch", "zcu102", "--boards", "2", "--calib",
                 str(EXAMPLES / "mixed_cnn_calib.npz"), "-o", str(out), "-q"]) == 0
    assert "bit-identical to the single-board run" in capsys.readouterr().out
    assert main(["run", str(out / "pipeline.json"), "--input", str(EXAMPLES / "mixed_cnn_input.npz")]) == 0
    assert "ran 2 stages with the local executor" in capsys.readouterr().out


def test_dse_ranks_configurations_for_several_dpu_subgraphs(single):
    """Each configuration's latency is every DPU subgraph's program compiled for it and simulated, added; the CPU
    ops (the measured host cost model) cap the throughput of every configuration alike."""
    from tvm_dpu.arch import load_arch
    from tvm_dpu.backend.dpu_compile import compile_subgraph
    from tvm_dpu.pipeline.dse import explore, model_cpu_seconds
    from tvm_dpu.timing.simulate import simulate

    cands = explore(single, 700, 300, clocks_mhz=(300.0,), max_cores=2)
    assert len({c.dpu for c in cands}) > 3 and all(c.dsp <= 700 and c.bram36k <= 300 for c in cands)
    assert [c.fps for c in cands] == sorted((c.fps for c in cands), reverse=True)
    cpu_s = model_cpu_seconds(single)
    assert cpu_s > 0 and all(c.cpu_ms == pytest.approx(cpu_s * 1e3) for c in cands)
    assert all(c.fps <= 1 / cpu_s * (1 + 1e-9) for c in cands)
    for c in cands[:3]:
        arch = load_arch(c.dpu)
        cycles = sum(simulate(compile_subgraph(r.graph, arch)[0].code, arch).cycles for r in single.runners.values())
        assert c.latency_ms == pytest.approx(cycles / 300e6 * 1e3)
        assert c.fps == pytest.approx(min(c.cores / (c.latency_ms / 1e3), 1 / cpu_s)) or c.ddr_bound


def test_pipeline_on_boards_chosen_by_dse_is_bit_identical(single, frames, reference):
    from tvm_dpu.pipeline.dse import choose_boards, device_budget

    boards = choose_boards(single, [device_budget("zu3eg"), device_budget("zu9eg")], 1 << 30)
    assert boards[1].arch.startswith("B4096") and boards[0].spec is not None
    pipe = PipelineModel.from_model(single, boards)
    assert all(s["host_ms"] > 0 for s in pipe.plan["stages"])
    outs = list(pipe.run_stream(frames, max_in_flight=2))
    assert all(_same(g, r) for g, r in zip(outs, reference))
    pipe.close()


def test_cli_dse_and_pipeline_part_take_the_bundled_example(tmp_path, capsys):
    import json

    from tvm_dpu.cli import main

    model, calib = str(EXAMPLES / "mixed_cnn.onnx"), str(EXAMPLES / "mixed_cnn_calib.npz")
    assert main(["dse", model, "--calib", calib, "--part", "zu3eg", "--json", str(tmp_path / "d.json"), "-q"]) == 0
    text = capsys.readouterr().out
    assert "rank dpu" in text and "CPU ops on the host:" in text
    rows = json.loads((tmp_path / "d.json").read_text())
    assert len(rows) > 3 and all(r["cpu_ms"] > 0 and r["latency_ms"] > 0 for r in rows)
    assert main(["pipeline", model, "--calib", calib, "--part", "zu3eg,zu9eg", "--boards", "2", "-o",
                 str(tmp_path / "p"), "-q"]) == 0
    text = capsys.readouterr().out
    assert "zu3eg -> B" in text and "zu9eg -> B4096@300MHz" in text
    assert "bit-identical to the single-board run" in text
    doc = json.loads((tmp_path / "p" / "pipeline.json").read_text())
    assert [s["part"] for s in doc["stages"]] == ["zu3eg", "zu9eg"]
