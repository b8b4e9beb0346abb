"""AMD's own XIR and VART libraries (Debian's libxir-dev / libvart-dev 2.5) on vai_c's files and ours, as far as
they run without a DPU: tests/vart/vart_driver.cpp, built here, loads a file with XIR and runs VART's zero-copy
helper on every DPU subgraph (`extract_reg_info_from_subgraph`: VART's region maps and, through
`get_op_output_tensor_ddr`, the placement of every input and output tensor). That is VART's code judging the same
reads tvm_dpu/xmodel/vart_check.py restates, so the two are held against each other: same regions, same I/O
tensors, and where a mutated file makes VART abort, the checker names the rule. `vart::Runner::create_runner`
stops at the DPU controller (no XRT device), before it reads the subgraph: the last test pins where.
Skipped with the reason where the packages or a C++ compiler are absent."""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from test_vart_check import BASE, MUTATIONS, VAI_C, _mutated  # noqa: E402 isort: skip (tests/ on sys.path)
from tvm_dpu.xmodel.model import read_xmodel
from tvm_dpu.xmodel.vart_check import check_vart, xir_io_tensors

DRIVER = Path(__file__).parent / "vart" / "vart_driver.cpp"
HEADERS = [Path("/usr/include/vart/zero_copy_helper.hpp"), Path("/usr/include/xir/graph/graph.hpp")]
LIBS = ["-lvart-util", "-lvart-runner", "-lxir", "-lunilog", "-lglog"]
#: VART's reg_type_t for our reader's context types (zero_copy_helper.cpp extract_reg_info_from_subgraph).
V2_TO_VART = {"CONST": {"CONST"}, "WORKSPACE": {"DATA_GLOBAL"}, "DATA": {"DATA_LOCAL"},
              "INTERFACE": {"DATA_LOCAL_INPUT", "DATA_LOCAL_OUTPUT", "DATA_LOCAL"}}


@pytest.fixture(scope="module")
def driver(tmp_path_factory) -> Path:
    cxx = shutil.which("g++") or shutil.which("c++")
    missing = [str(h) for h in HEADERS if not h.exists()]
    if cxx is None or missing:
        pytest.skip(f"AMD's XIR/VART 2.5 headers or a C++ compiler absent ({', '.join(missing) or 'no g++'}): "
                    "apt-get install libxir-dev libvart-dev libunilog-dev g++")
    exe = tmp_path_factory.mktemp("vart") / "vart_driver"
    r = subprocess.run([cxx, "-std=c++17", "-O1", "-o", str(exe), str(DRIVER), *LIBS], capture_output=True,
                       text=True, timeout=300)
    if r.returncode != 0:
        pytest.skip(f"vart_driver.cpp did not build against the installed XIR/VART: {r.stderr.strip()[-400:]}")
    return exe


def _drive(driver: Path, path: Path, mode: str = "regs") -> subprocess.CompletedProcess:
    return subprocess.run([str(driver), str(path), mode], capture_output=True, text=True, timeout=120)


def _parse(stdout: str) -> dict[str, dict]:
    """{subgraph: {"inputs": [...], "outputs": [...], "regs": {n: (type, size)}}} from the driver's output."""
    out: dict[str, dict] = {}
    cur: dict = {}
    for line in stdout.splitlines():
        word, _, rest = line.strip().partition(" ")
        if line.startswith("subgraph "):
            cur = out.setdefault(rest, {"inputs": [], "outputs": [], "regs": {}})
        elif word in ("input", "output"):
            cur[f"{word}s"].append(rest)
        elif word == "reg":
            name, kind, size = rest.split()
            cur["regs"][int(name[4:])] = (kind, int(size))
    return out


def _agree(driver: Path, path: Path) -> None:
    """VART's zero-copy helper runs to the end on `path` and sees the regions and I/O tensors our reader does."""
    r = _drive(driver, path)
    assert r.returncode == 0 and "regs done" in r.stdout, r.stderr[-2000:]
    vart = _parse(r.stdout)
    model = read_xmodel(path)
    dpus = model.subgraphs("DPU")
    assert sorted(vart) == sorted(sg.name for sg in dpus)
    for sg in dpus:
        ins, outs = xir_io_tensors(model, sg)
        assert (vart[sg.name]["inputs"], vart[sg.name]["outputs"]) == (ins, outs)
        ours = model.dpu_subgraph(sg).regions
        assert sorted(vart[sg.name]["regs"]) == sorted(ours)
        for n, (kind, size) in vart[sg.name]["regs"].items():
            assert size == ours[n].size and kind in V2_TO_VART[ours[n].context_type_v2 or ours[n].context_type]


@pytest.mark.parametrize("path", VAI_C, ids=lambda p: p.name)
def test_vart_reads_vai_c_files_as_our_reader_does(driver, path):
    _agree(driver, path)


def test_vart_reads_our_export_as_our_reader_does(driver, tmp_path):
    from tests.test_xmodel_write import _build

    _agree(driver, _build().export(tmp_path / "m.xmodel"))


@pytest.mark.parametrize("name,message", [
    ("data-fix feeding a conv, not an upload", "illegal xmodel. op:input_1  has no ddr info"),
    ("INTERFACE with no I/O", "invalid type"),
    ("region REG_X", "reg id is not support! reg_id = REG_X"),
])
def test_where_vart_aborts_the_checker_names_the_rule(driver, tmp_path, name, message):
    """Mutations VART's own zero-copy helper refuses (a glog CHECK: the process aborts) are findings of the
    checker, under the rule whose VART function that CHECK sits in."""
    rule, mutate = MUTATIONS[name]
    path = tmp_path / "m.xmodel"
    path.write_bytes(_mutated(mutate))
    r = _drive(driver, path)
    assert r.returncode != 0 and "regs done" not in r.stdout
    assert message in r.stderr, r.stderr[-2000:]
    assert rule in {f.rule for f in check_vart(read_xmodel(path)) if f.severity == "error"}


def test_create_runner_stops_at_the_dpu_controller(driver):
    """vart::Runner::create_runner(subgraph, "run") loads libvart-dpu-runner.so (the `runner` attribute) and
    constructs the DPU session, whose first step is xir::DpuController::get_instance(): with no DPU controller
    registered (no XRT device, no board) that CHECK aborts, before any read of the subgraph's regions or
    tensors. docs/deploy.md says so; this test notices if a VART install ever gets further."""
    r = _drive(driver, BASE, "runner")
    assert "regs done" in r.stdout and "create_runner subgraph_quant_conv2d" in r.stdout
    assert r.returncode != 0 and "runner created" not in r.stdout
    assert "dpu_controller.cpp" in r.stderr and "the_factory_methods.empty()" in r.stderr, r.stderr[-2000:]
