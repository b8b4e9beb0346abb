"""Shared pytest configuration, fixtures and the emulator-vs-golden harness."""
from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest


def pytest_configure(config):
    # The trust policy's records (artifacts built here, trusted keys) live in a config directory: the tests use
    # their own, so they neither read nor grow the user's (child processes inherit it).
    os.environ["TVM_DPU_CONFIG_DIR"] = tempfile.mkdtemp(prefix="tvm_dpu_test_config_")


@dataclass
class EmulatorVsGolden:
    """One compiled graph run on the emulator and on the golden reference with the same int8 inputs."""

    compiled: Any  # the CompiledSubgraph
    by_output: dict[str, int]  # output tensor -> elements where the emulator's differs from the golden's

    @property
    def bad(self) -> int:
        """Elements that differ, over every output."""
        return sum(self.by_output.values())


def emulator_vs_golden(graph: Any, arch: Any, plan: Any = None, seed: int = 0) -> EmulatorVsGolden:
    """Compile `graph` (a quantized XGraph; its outputs default to the last op's) for `arch` (a name or an Arch),
    unfused or along the fusion `plan`, feed seeded random int8 inputs and compare every output of the emulator
    with the golden reference's (the shapes must agree). The test harness of codegen and fusion."""
    from tvm_dpu.arch import load_arch
    from tvm_dpu.codegen.compiler import compile_graph, compile_graph_fused
    from tvm_dpu.emulator.core import Emulator
    from tvm_dpu.xgraph import run_graph

    arch = load_arch(arch)
    graph.outputs = graph.outputs or [graph.ops[-1].outputs[0]]
    compiled = compile_graph(graph, arch) if plan is None else compile_graph_fused(graph, arch, plan)
    rng = np.random.default_rng(seed)
    feeds = {n: rng.integers(-128, 128, graph.tensors[n].shape).astype(np.int8) for n in graph.inputs}
    regions = compiled.new_regions()
    for b in compiled.inputs:
        b.fmap.to_ddr(regions[b.fmap.reg_id], feeds[b.name])
    Emulator(arch).run(compiled.code, regions)
    golden = run_graph(graph, feeds)
    by_output = {}
    for b in compiled.outputs:
        got, exp = b.fmap.from_ddr(regions[b.fmap.reg_id]), golden[b.name]
        assert got.shape == exp.shape, f"{b.name}: emulator shape {got.shape}, golden {exp.shape}"
        by_output[b.name] = int(np.sum(got != exp))
    return EmulatorVsGolden(compiled, by_output)


def load_bench(name: str) -> Any:
    """benchmarks/<name>.py imported as a module (the benchmarks are scripts, not a package)."""
    import importlib.util
    from pathlib import Path

    spec = importlib.util.spec_from_file_location(name, Path(__file__).resolve().parents[1] / "benchmarks" /
                                                  f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


#: The grid the fake-simulator tests of bench_calibration.fit scan (tests/test_calibration_bench.py,
#: tests/test_calibration_vaic.py), fixed here so they check the fit's logic whatever grid the shipped fit scans.
FAKE_FIT_GRID = {"conv_fill_cycles": (24, 48, 64, 96, 128, 160, 192, 224, 256, 288, 320, 384),
                 "dma_bank_rows_per_cycle": (1, 2), "ddr_latency_ns": (0.0, 50.0, 100.0, 150.0, 200.0),
                 "host_pre_post_ms": tuple(round(0.1 * i, 1) for i in range(21))}


@pytest.fixture
def fake_fit_grid(monkeypatch):
    """Apply FAKE_FIT_GRID to a loaded bench_calibration module (our rows' own scan: the conv fill and bank rows
    at params.json's DDR latency); returns the module."""
    def apply(bench: Any) -> Any:
        monkeypatch.setattr(bench, "FIT_GRID", FAKE_FIT_GRID)
        monkeypatch.setattr(bench, "_SIM_KEYS", [k for k in FAKE_FIT_GRID if k != "host_pre_post_ms"])
        monkeypatch.setattr(bench, "OURS_SCAN_KEYS", ("conv_fill_cycles", "dma_bank_rows_per_cycle"))
        return bench
    return apply


@pytest.fixture(scope="module")
def model():
    """The bundled mixed CPU/DPU example network (ONNX ModelProto)."""
    from tvm_dpu import zoo

    return zoo.build_model("mixed_cnn")


@pytest.fixture(scope="session")
def small_artifact(tmp_path_factory):
    """The reduced mixed_cnn compiled for zcu102 (random calibration) and exported: a .tvmdpu path."""
    import warnings

    import tvm_dpu
    from tvm_dpu import zoo

    path = tmp_path_factory.mktemp("small_artifact") / "m.tvmdpu"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tvm_dpu.build(zoo.build_model("mixed_cnn", reduced=True), arch="zcu102", progress=False).export(path)
    return path


@pytest.fixture(scope="module")
def calib(model):
    """Two seeded calibration inputs for `model`."""
    from tvm_dpu import zoo

    return [zoo.random_input(model, seed=s) for s in range(2)]

_CONFORMANCE = "test_isa1_conformance.py::"
_KINDS = {"::test_case[": "cases", "::test_encoding[": "encodings"}


def _conformance_counts(stats: dict) -> dict[str, tuple[int, int]]:
    """{'cases': (passed, ran), 'encodings': (...)} over this session's conformance test reports.

    A test passed when its call phase passed and no phase failed; skipped tests count as ran, not passed.
    """
    ran: dict[str, set[str]] = {k: set() for k in _KINDS.values()}
    passed: dict[str, set[str]] = {k: set() for k in _KINDS.values()}
    failed: set[str] = set()
    for reports in stats.values():
        for rep in reports:
            nodeid = getattr(rep, "nodeid", "")
            if _CONFORMANCE not in nodeid or getattr(rep, "when", None) is None:
                continue
            kind = next((k for marker, k in _KINDS.items() if marker in nodeid), None)
            if kind is None:
                continue
            ran[kind].add(nodeid)
            if rep.failed:
                failed.add(nodeid)
            elif rep.when == "call" and rep.passed:
                passed[kind].add(nodeid)
    return {k: (len(passed[k] - failed), len(ran[k])) for k in ran}


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    counts = _conformance_counts(terminalreporter.stats)
    (n, m), (k, l) = counts["cases"], counts["encodings"]
    if m or l:
        terminalreporter.write_line(f"ISA1 conformance: {n}/{m} cases, {k}/{l} encodings")
