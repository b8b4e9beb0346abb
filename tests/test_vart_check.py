"""The VART checker (tvm_dpu/xmodel/vart_check.py, `tvm-dpu inspect --check-vart`): vai_c's vendored files break
no rule; copies of one with a single read of VART's broken (written back to protobuf and read again) each fail
with the rule that read belongs to; tvm-dpu's own exports are checked the same way."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Callable

import pytest

from tvm_dpu.xmodel.encode import encode_graph
from tvm_dpu.xmodel.model import read_xmodel
from tvm_dpu.xmodel.reader import Attr, decode_graph
from tvm_dpu.xmodel.vart_check import RULES, check_vart

from test_xmodel_xir import EXPORTS, SLOW, _export, _mixed_cnn  # noqa: E402 isort: skip (tests/ on sys.path)

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "data" / "xmodel"
# VART's edge (DPUCZDX8G) runner's rules; the DPUCAHX8H files of dpucahx8h/ are checked in tests/test_isa_dpuv3e.py
VAI_C = sorted(p for p in DATA.rglob("*.xmodel") if "dpucahx8h" not in p.parts)
BASE = DATA / "tf2_custom_op_vai3.0_isa1.xmodel"


@pytest.mark.parametrize("path", VAI_C, ids=lambda p: p.name)
def test_vai_c_files_break_no_rule(path):
    findings = check_vart(read_xmodel(path))
    assert findings == []


def _dpu(g: dict) -> dict:
    """The first DPU subgraph of a decoded graph."""
    return next(c for c in g["subg_root"]["subg_child"] if c["subg_attr"]["device"].value == "DPU")


def _op(g: dict, name: str) -> dict:
    return next(o for o in g["op_node"] if o["op_name"] == name)


def _tattr(g: dict, op: str) -> dict:
    return _op(g, op)["output_tensor"]["tensor_attr"]


def _set_map(sg: dict, key: str, entry: str, value) -> None:
    a = sg["subg_attr"][key]
    sg["subg_attr"][key] = Attr(a.kind, {**a.value, entry: value})


def _drop_map(sg: dict, key: str, entry: str) -> None:
    a = sg["subg_attr"][key]
    sg["subg_attr"][key] = Attr(a.kind, {k: v for k, v in a.value.items() if k != entry})


# In vai_c's VAI 3.0 file: quant_conv2d (a map kept on chip, location 0), quant_max_pooling2d_fix (REG_1, 2048
# bytes at 15488 of a 17536-byte region), quant_max_pooling2d_1_fix (the output, REG_3), input_1 (the data-fix
# feeding the upload input_1_upload_0).
MUTATIONS: dict[str, tuple[str, Callable[[dict], None]]] = {
    "feature map without reg_id": ("ddr-info", lambda g: _tattr(g, "quant_max_pooling2d_fix").pop("reg_id")),
    "const without ddr_addr": ("ddr-info", lambda g: _tattr(g, "quant_conv2d_bias").pop("ddr_addr")),
    "data-fix feeding a conv, not an upload": (
        "ddr-info", lambda g: _op(g, "quant_conv2d")["args"][0].update(arg_ops=["input_1"])),
    "ddr_addr past its region": ("tensor-region",
                                 lambda g: _tattr(g, "quant_max_pooling2d_fix").update(
                                     ddr_addr=Attr("int32_value", 16000))),
    "reg_id of no region": ("tensor-region",
                            lambda g: _tattr(g, "quant_max_pooling2d_fix").update(reg_id=Attr("int32_value", 7))),
    "location 2": ("tensor-region", lambda g: _tattr(g, "quant_max_pooling2d_fix").update(
        location=Attr("int32_value", 2))),
    "reg_id as int64": ("attr-type", lambda g: _tattr(g, "quant_max_pooling2d_fix").update(
        reg_id=Attr("int64_value", 1))),
    "wrong fingerprint": ("fingerprint", lambda g: _dpu(g)["subg_attr"].update(
        dpu_fingerprint=Attr("uint64_value", 0x0101000099999999))),
    "mc_code cut mid-word": ("mc-code", lambda g: _dpu(g)["subg_attr"].update(
        mc_code=Attr("bytes_value", _dpu(g)["subg_attr"]["mc_code"].value[:-2]))),
    "no mc_code": ("mc-code", lambda g: _dpu(g)["subg_attr"].pop("mc_code")),
    "no parameter bytes": ("const-params", lambda g: _dpu(g)["subg_attr"].pop("reg_id_to_parameter_value")),
    "parameters longer than REG_0": ("const-params", lambda g: _set_map(_dpu(g), "reg_id_to_size", "REG_0", 64)),
    "REG_1 without a size": ("reg-size", lambda g: _drop_map(_dpu(g), "reg_id_to_size", "REG_1")),
    "no reg_id_to_context_type": ("reg-maps", lambda g: _dpu(g)["subg_attr"].pop("reg_id_to_context_type")),
    "region REG_X": ("reg-name", lambda g: _set_map(_dpu(g), "reg_id_to_context_type_v2", "REG_X", "WORKSPACE")),
    "v1 and v2 disagree": ("reg-maps-agree",
                           lambda g: _set_map(_dpu(g), "reg_id_to_context_type_v2", "REG_1", "CONST")),
    "INTERFACE with no I/O": ("reg-type",
                              lambda g: _set_map(_dpu(g), "reg_id_to_context_type_v2", "REG_1", "INTERFACE")),
    "no runner": ("runner-attr", lambda g: _dpu(g)["subg_attr"].pop("runner")),
    "output kept on chip": ("io-location", lambda g: _tattr(g, "quant_max_pooling2d_1_fix").update(
        location=Attr("int32_value", 0))),
    "input with padded strides": ("io-stride", lambda g: _tattr(g, "input_1").update(
        stride=Attr("int32_vec_value", [1024, 32, 1, 1]))),
    "tensor without fix_point": ("fix-point", lambda g: _tattr(g, "quant_conv2d").pop("fix_point")),
    "debug order names no child": ("debug-order", lambda g: _dpu(g)["subg_attr"].update(
        children_topological_sort=Attr("string_vec_value", ["subgraph_quant_conv2d", "nope"]))),
}


def _mutated(mutate: Callable[[dict], None]) -> bytes:
    g = decode_graph(BASE.read_bytes())
    mutate(g)
    return encode_graph(g)


def test_every_rule_has_a_mutation_that_breaks_it():
    assert {rule for rule, _ in MUTATIONS.values()} | {"const-bytes"} == set(RULES)


@pytest.mark.parametrize("name", list(MUTATIONS))
def test_a_broken_read_fails_with_its_rule(name):
    rule, mutate = MUTATIONS[name]
    findings = check_vart(read_xmodel(_mutated(mutate)))
    errors = [f for f in findings if f.severity == "error"]
    assert rule in {f.rule for f in errors}, [str(f) for f in findings]
    hit = next(f for f in errors if f.rule == rule)
    assert "subgraph_quant_conv2d" in hit.where and hit.source == RULES[rule][0]


def test_const_data_other_than_its_region_fails():
    """vai_c leaves const-fix `data` empty; bytes that are not the CONST region's at the tensor's place fail."""
    def mutate(g):
        bias = _op(g, "quant_conv2d_bias")
        bias["op_attr"]["data"] = Attr("bytes_value", bytes(range(100, 132)))
    findings = check_vart(read_xmodel(_mutated(mutate)))
    assert [f.rule for f in findings] == ["const-bytes"]


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tvm_dpu.cli", "inspect", "--check-vart", *args],
                          capture_output=True, text=True, cwd=ROOT, timeout=120)


def test_cli_exit_status_and_json(tmp_path):
    ok = _cli(str(BASE))
    assert ok.returncode == 0, ok.stderr
    assert "0 error(s), 0 warning(s)" in ok.stdout
    bad = tmp_path / "bad.xmodel"
    bad.write_bytes(_mutated(MUTATIONS["feature map without reg_id"][1]))
    r = _cli(str(bad))
    assert r.returncode == 1
    assert "[ddr-info]" in r.stdout and "quant_max_pooling2d_fix has no ddr info" in r.stdout
    r = _cli(str(bad), "--json")
    assert r.returncode == 1
    doc = json.loads(r.stdout)
    assert [f["rule"] for f in doc["findings"]] == ["ddr-info"]
    assert doc["findings"][0]["source"].startswith("get_op_output_tensor_ddr")


@pytest.fixture(scope="module")
def outdir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("vart")


def _no_findings(path: Path) -> None:
    findings = check_vart(read_xmodel(path))
    assert [str(f) for f in findings] == []


@pytest.mark.parametrize("key", [k for k, _ in EXPORTS])
def test_every_export_breaks_no_rule(outdir, key):
    """The exports tests/test_xmodel_xir.py judges with AMD's XIR (reduced zoo models on three archs, a QDQ model,
    two DPU partitions with host ops between, every DPU op type; built once per session for both files)."""
    _no_findings(_export(outdir, key, dict(EXPORTS)[key])[1])


@pytest.mark.parametrize("arch", ["zcu102", "dnnvm-zu2"])
def test_readme_example_breaks_no_rule(tmp_path, arch):
    """The README's mixed CNN (two DPU partitions, host convs as XIR CPU ops); on dnnvm-zu2 (B1152) its packed
    CONST region holds a second packing of conv1's weights between conv1's bias and the next constant."""
    _no_findings(_mixed_cnn(arch).export(tmp_path / "mixed_cnn.xmodel"))


@pytest.mark.slow
@pytest.mark.parametrize("key", [k for k, _ in SLOW])
def test_every_reduced_zoo_export_breaks_no_rule(outdir, key):
    _no_findings(_export(outdir, key, dict(SLOW)[key])[1])


def test_cli_refuses_an_artifact_with_one_error(tmp_path):
    art = tmp_path / "m.tvmdpu"
    art.write_bytes(b"not checked: the name says artifact")  # it must exist: a missing file is reported first
    r = _cli(str(art))
    assert r.returncode == 2 and "is not an .xmodel" in r.stderr and "Traceback" not in r.stderr
