"""TVM's exported library as a file the tools read: `tvm-dpu inspect|report|run m.so`, the DPU modules'
`inspect_source()`, and `tvm_dpu.describe` (what each DPU partition holds)."""
from __future__ import annotations

import hashlib
import json
import warnings

import numpy as np
import pytest
import tvm
from tvm import relax
from tvm.relax.frontend.onnx import from_onnx as tvm_from_onnx

import tvm_dpu
from tvm_dpu import zoo
from tvm_dpu.cli import EXIT_USER_ERROR, main
from tvm_dpu.errors import ArtifactError
from tvm_dpu.runtime import artifact


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """mixed_cnn compiled by tvm.compile for zcu102 (two DPU partitions), its compile record and its .so."""
    model = zoo.build_model("mixed_cnn")
    record: list = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ex = tvm.compile(tvm_from_onnx(model), target="dpu-zcu102",
                         relax_pipeline=relax.get_pipeline("dpu", calibration="random", fusion="none", record=record))
    path = tmp_path_factory.mktemp("lib") / "m.so"
    ex.export_library(str(path))
    return ex, record[0], path, model


def _loaded(path) -> bool:
    return hashlib.sha256(path.read_bytes()).digest() in artifact._LIBRARIES


def _modules(m):
    yield m
    for child in m.imports:
        yield from _modules(child)


def test_dpu_modules_say_what_they_hold(built):
    ex, result, _, _ = built
    sources = [m.inspect_source() for m in _modules(ex.mod) if m.kind == "c"]
    assert len(sources) == 1 and sources[0]
    text = sources[0]
    for sym, part in result.partitions.items():
        sg = part.sg
        assert f"DPU partition {sym}: arch zcu102" in text
        assert f"{sum(sg.instr_counts.values())} instructions" in text
        for b in [*sg.inputs, *sg.outputs]:
            assert f"{b.name}: shape {tuple(b.shape)}, fix_point {b.fix_point}" in text
    # the code itself is in the static libraries below it
    assert sum(m.kind == "static_library" for m in _modules(ex.mod)) == len(result.partitions)


def test_describe_the_executable_and_the_file(built):
    ex, result, path, _ = built
    in_memory, on_disk = tvm_dpu.describe(ex), tvm_dpu.describe(path)
    assert {d["symbol"]: d for d in in_memory} == {d["symbol"]: d for d in on_disk}
    assert not _loaded(path)  # read, not loaded
    for d in on_disk:
        sg = result.partitions[d["symbol"]].sg
        assert d["arch"] == "zcu102" and d["fingerprint"] == f"{sg.fingerprint:#x}"
        assert d["instr_counts"] == dict(sorted(sg.instr_counts.items())) and d["instructions"] == sum(
            sg.instr_counts.values())
        assert [t["fix_point"] for t in d["inputs"]] == [b.fix_point for b in sg.inputs]
        assert [t["fix_point"] for t in d["outputs"]] == [b.fix_point for b in sg.outputs]
    with pytest.raises(ArtifactError, match="loaded with tvm.runtime.load_module"):
        tvm_dpu.describe(tvm.runtime.load_module(str(path)))


def test_inspect_and_report_read_the_library_without_loading_it(built, tmp_path, capsys):
    _, result, path, _ = built
    assert main(["inspect", str(path)]) == 0
    text = capsys.readouterr().out
    assert "TVM exported library" in text and "arch: zcu102" in text
    for sym, part in result.partitions.items():
        assert f" {part.sg.name}: " in text and f"symbol {sym[:60]}" in text
        for b in part.sg.inputs:
            assert f"input  {b.name}: shape {tuple(b.shape)}, fix_point {b.fix_point}" in text
    assert main(["inspect", str(path), "--json"]) == 0
    meta = json.loads(capsys.readouterr().out)
    assert len(meta["subgraphs"]) == len(result.partitions) and meta["arch"]["name"] == "zcu102"
    assert main(["inspect", str(path), "--disasm"]) == 0 and "END" in capsys.readouterr().out
    assert main(["inspect", str(path), "--check-deps"]) == 0
    capsys.readouterr()
    out = tmp_path / "r.html"
    assert main(["report", str(path), "-o", str(out)]) == 0
    page = out.read_text()
    assert all(sym in page for sym in result.partitions) and "2 DPU subgraph(s)" in capsys.readouterr().out
    assert not _loaded(path)


def test_run_needs_trust_then_matches_tvms_own_load(built, tmp_path, capsys):
    _, _, path, model = built
    assert main(["run", str(path)]) == EXIT_USER_ERROR
    assert "a shared library is native code" in capsys.readouterr().err
    assert not _loaded(path)
    x = zoo.random_input(model, seed=6)
    np.savez(tmp_path / "x.npz", input=x)
    assert main(["run", str(path), "--allow-unsigned", "--input", str(tmp_path / "x.npz"), "--runs", "2",
                 "-o", str(tmp_path / "y.npz")]) == 0
    want = relax.VirtualMachine(tvm.runtime.load_module(str(path)), tvm.cpu())["main"](tvm.runtime.tensor(x)).numpy()
    np.testing.assert_array_equal(np.load(tmp_path / "y.npz")["output_0"], want)
    # no golden data in a library: says so and where to get it
    assert main(["run", str(path), "--allow-unsigned", "--verify"]) == EXIT_USER_ERROR
    assert "a TVM exported library (.so) carries no verification data" in capsys.readouterr().err


def test_a_signed_library_runs_with_its_key_and_a_changed_one_does_not(built, tmp_path, capsys):
    from tvm_dpu.security.signing import generate_keypair, sign

    _, _, path, _ = built
    key, pub = generate_keypair(str(tmp_path / "k"))
    signed = tmp_path / "signed.so"
    signed.write_bytes(sign(path.read_bytes(), key))
    assert main(["run", str(signed), "--require-signature", str(pub)]) == 0
    capsys.readouterr()
    tampered = bytearray(signed.read_bytes())
    tampered[100] ^= 1
    bad = tmp_path / "bad.so"
    bad.write_bytes(bytes(tampered))
    assert main(["run", str(bad), "--require-signature", str(pub)]) == EXIT_USER_ERROR
    assert "does not match" in capsys.readouterr().err


def test_a_library_without_dpu_programs_is_a_clear_error(tmp_path, capsys):
    ex = tvm.compile(tvm_from_onnx(zoo.build_model("mixed_cnn")), target="llvm")
    ex.export_library(str(tmp_path / "cpu.so"))
    assert main(["inspect", str(tmp_path / "cpu.so")]) == EXIT_USER_ERROR
    assert "no tvm-dpu DPU program in it" in capsys.readouterr().err
