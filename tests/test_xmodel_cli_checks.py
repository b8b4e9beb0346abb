"""`tvm-dpu inspect --check-xir` (AMD's XIR's load and shape inference, beside --check-vart), and what `inspect` and
`run --verify` say about who wrote an .xmodel: files tvm-dpu wrote are labelled tvm-dpu and verified against
tvm-dpu's golden reference of the file's own quantized ops; vai_c's are labelled vai_c and refused by --verify."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from tvm_dpu.cli import main
from tvm_dpu.xmodel import xir_judge
from tvm_dpu.xmodel.commands import compiled_by
from tvm_dpu.xmodel.encode import encode_graph
from tvm_dpu.xmodel.model import read_xmodel
from tvm_dpu.xmodel.reader import Attr, decode_graph

from test_xmodel_xir import _without_attr, needs_xir  # noqa: E402 isort: skip (tests/ on sys.path)

DATA = Path(__file__).parent / "data" / "xmodel"
VAI_C = DATA / "tf2_custom_op_vai3.0_isa1.xmodel"


@pytest.fixture(scope="module")
def ours(tmp_path_factory) -> Path:
    """Two DPU partitions with host softmax between and after (the writer tests' model), exported by tvm-dpu."""
    from test_xmodel_write import _build

    return _build().export(tmp_path_factory.mktemp("ours") / "ours.xmodel")


# -- --check-xir ----------------------------------------------------------------------------------------------
@needs_xir
def test_check_xir_passes_ours_and_vai_c_and_refuses_a_broken_file(ours, tmp_path, capsys):
    assert main(["inspect", "--check-xir", str(ours)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("AMD's XIR: ") and "XIR's shape inference agrees on every op" in out
    assert main(["inspect", "--check-xir", "--json", str(VAI_C)]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["xir"]["ok"] and doc["xir"]["ops"] == len(read_xmodel(VAI_C).ops) and doc["xir"]["mismatches"] == []
    assert "findings" not in doc  # no --check-vart asked
    bad = tmp_path / "bad.xmodel"
    bad.write_bytes(_without_attr(VAI_C, "fix2float", "bit_width"))
    assert main(["inspect", "--check-xir", str(bad)]) == 1
    out = capsys.readouterr().out
    assert "XIR refused it" in out and "bit_width" in out


@needs_xir
def test_check_xir_and_vart_together(ours, capsys):
    assert main(["inspect", "--check-xir", "--check-vart", "--json", str(ours)]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["xir"]["ok"] and doc["findings"] == []
    assert main(["inspect", "--check-xir", "--check-vart", str(ours)]) == 0
    out = capsys.readouterr().out
    assert "AMD's XIR:" in out and "0 error(s), 0 warning(s)" in out


def test_check_xir_without_a_compiler_is_one_clear_error(ours, monkeypatch, capsys):
    monkeypatch.setenv("CXX", "no-such-c++-compiler")
    xir_judge._build.cache_clear()
    try:
        assert main(["inspect", "--check-xir", str(ours)]) == 2
    finally:
        xir_judge._build.cache_clear()
    err = capsys.readouterr().err
    assert "--check-xir: AMD's XIR cannot be run on this machine: no C++ compiler (no-such-c++-compiler)" in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_check_xir_refuses_an_artifact(tmp_path, capsys):
    (tmp_path / "m.tvmdpu").write_bytes(b"")  # a file that exists: the CLI reports a missing one first
    assert main(["inspect", "--check-xir", str(tmp_path / "m.tvmdpu")]) == 2
    assert "--check-xir: " in capsys.readouterr().err


# -- provenance ----------------------------------------------------------------------------------------------
def test_inspect_says_who_wrote_the_file(ours, capsys):
    assert main(["inspect", str(ours)]) == 0
    head = capsys.readouterr().out.splitlines()[0]
    assert "compiled by tvm-dpu (tvm-dpu." in head and "origin tvm-dpu" in head and "vai_c" not in head
    assert main(["inspect", str(VAI_C)]) == 0
    assert "compiled by vai_c (xcompiler.3.0.0; origin tensorflow2)" in capsys.readouterr().out
    # neither tvm-dpu's marks nor xcompiler's libs_info: said so, not guessed
    g = decode_graph(VAI_C.read_bytes())
    g["graph_attr"].pop("libs_info")
    g["graph_attr"]["origin"] = Attr("string_value", "onnx")
    assert compiled_by(read_xmodel(encode_graph(g))) == "an unknown compiler"
    assert main(["inspect", "--json", str(ours)]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert (doc["compiled_by"], doc["origin"]) == ("tvm-dpu", "tvm-dpu")


def test_run_verify_on_our_file_uses_the_golden_reference(ours, capsys):
    assert main(["run", str(ours), "--verify", "--runs", "2"]) == 0
    out = capsys.readouterr().out
    assert "verify: 2 DPU subgraph(s) of tvm-dpu's code" in out and "2 run(s), 4 subgraph calls, 0 mismatching" in out


def test_run_verify_finds_a_program_that_disagrees_with_the_file_ops(ours, tmp_path, capsys):
    """The golden reference reads the ops' int8 constants, never the CONST region the program reads: zeroing
    that region makes the program's outputs differ from the reference, and --verify says by how much."""
    g = decode_graph(ours.read_bytes())
    dpu = next(c for c in g["subg_root"]["subg_child"] if c["subg_attr"]["device"].value == "DPU")
    regs = dpu["subg_attr"]["reg_id_to_parameter_value"]
    dpu["subg_attr"]["reg_id_to_parameter_value"] = Attr(regs.kind, {k: bytes(len(v)) for k, v in regs.value.items()})
    bad = tmp_path / "bad.xmodel"
    bad.write_bytes(encode_graph(g))
    assert main(["run", str(bad), "--verify"]) == 1
    out = capsys.readouterr().out
    line = next(x for x in out.splitlines() if x.startswith("verify: "))
    assert "0 mismatching" not in line and "elements differ" in out


def test_run_verify_checks_vai_c_code_against_the_golden_reference_of_its_own_ops(capsys):
    assert main(["run", str(VAI_C), "--verify", "--runs", "2"]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("verify: "))
    assert "of vai_c's code against tvm-dpu's golden reference" in line and ", 0 mismatching elements" in line


def test_run_verify_on_our_file_whose_op_names_onnx_importers_rename(tmp_path, capsys):
    """The README example's ops carry dots (`branch_a.conv`), which TVM's ONNX importer replaces in an input's name:
    the rebuilt subgraph fed by the file's upload-op names found no feed for its second partition's input."""
    import numpy as np

    import tvm_dpu
    from tvm_dpu.xmodel.compare import feed_name

    examples = Path(__file__).resolve().parent.parent / "examples"
    calib = dict(np.load(examples / "mixed_cnn_calib.npz"))
    model = tvm_dpu.build(str(examples / "mixed_cnn.onnx"), arch="zcu102", calibration=calib, progress=False)
    path = model.export(tmp_path / "mixed_cnn.xmodel")
    uploads = [t.op for d in read_xmodel(path).dpu_subgraphs() for t in d.inputs]
    assert any("." in u for u in uploads)  # the case this test is about
    assert all(feed_name(u).isidentifier() for u in uploads)
    assert main(["run", str(path), "--verify"]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("verify: "))
    assert line.endswith("2 DPU subgraph(s) of tvm-dpu's code against tvm-dpu's golden reference of the file's own "
                         "quantized ops, 1 run(s), 2 subgraph calls, 0 mismatching elements")
