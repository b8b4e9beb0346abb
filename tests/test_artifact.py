"""The one-file artifact: round trip in a fresh process, safe loading (one clear error per defect), determinism,
cross-compiled CPU library for the board."""
from __future__ import annotations

import json
import shutil
import struct
import subprocess
import sys

import numpy as np
import pytest

from tvm_dpu import zoo
from tvm_dpu.arch import load_arch
from tvm_dpu.builder import build
from tvm_dpu.security.container import FIXED_SIZE, pack, unpack
from tvm_dpu.errors import ArtifactError
from tvm_dpu.runtime import artifact
import functools

from tvm_dpu.runtime.artifact import FORMAT_VERSION, MAGIC, read_header
from tvm_dpu.runtime.artifact import load as _load

# These tests forge artifacts (edited, then re-packed with checksums recomputed) to reach the checks behind the
# trust policy, so they load with trust="unsigned"; the policy itself is tested in test_trust_policy.py.
load = functools.partial(_load, trust="unsigned")
from tvm_dpu.runtime.device import EmulatorDevice
from tvm_dpu.util.toolchains import ELF_MACHINES, elf_machine

ARCH = "zcu102"


def _build(seed_count=2):
    model = zoo.build_model("mixed_cnn")
    calib = [zoo.random_input(model, seed=s) for s in range(seed_count)]
    compiled = build(model, arch=ARCH, calibration=calib, progress=False)
    return model, compiled


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    model, compiled = _build()
    path = compiled.export(tmp_path_factory.mktemp("art") / "m.tvmdpu")
    return model, compiled, path


def test_fresh_process_load_and_first_run(built, tmp_path):
    model, compiled, path = built
    x = zoo.random_input(model, seed=5)
    np.save(tmp_path / "x.npy", x)
    code = f"""
import time, numpy as np
t0 = time.perf_counter()
import tvm_dpu.runtime.artifact as a
m = a.load({str(path)!r})
t1 = time.perf_counter()
y = m.run(np.load({str(tmp_path / 'x.npy')!r}))[0]
t2 = time.perf_counter()
np.save({str(tmp_path / 'y.npy')!r}, y)
print(f"{{t1 - t0:.3f}} {{t2 - t1:.3f}}")
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    np.testing.assert_array_equal(np.load(tmp_path / "y.npy"), compiled.run(x)[0])
    header, sizes = read_header(path)
    assert header["outputs"] == [{"name": "output", "shape": [1, 10], "dtype": "float32"}]  # the ONNX name
    assert [s["id"] for s in header["subgraphs"]] == sorted(compiled.subgraph_ids.values())
    assert all(s["code_bytes"] > 0 and s["param_bytes"] > 0 for s in header["subgraphs"])


def _damage(path, tmp_path, fn, name):
    data = bytearray(path.read_bytes())
    fn(data)
    bad = tmp_path / name
    bad.write_bytes(bytes(data))
    return bad


def test_truncated_flipped_version_and_magic_each_one_clear_error(built, tmp_path):
    _, _, path = built
    header, _ = read_header(path)
    hlen = struct.unpack_from("<Q", path.read_bytes(), 12)[0]
    sec = header["sections"][f"lib.{artifact.host_machine()}"]
    code_at = FIXED_SIZE + hlen + sec["offset"]

    def truncate(d):
        del d[len(d) // 2:]

    def flip(d):
        d[code_at + 7] ^= 0x10

    def version(d):
        d[8:12] = struct.pack("<I", FORMAT_VERSION + 1)

    def magic(d):
        d[0:8] = b"NOTADPU!"

    cases = [(truncate, r"truncated: \d+ bytes"), (flip, r"checksum mismatch .* section 'lib\."),
             (version, rf"unknown tvm-dpu artifact format version {FORMAT_VERSION + 1}"),
             (magic, "not a tvm-dpu artifact file")]
    for fn, pattern in cases:
        bad = _damage(path, tmp_path, fn, fn.__name__ + ".tvmdpu")
        with pytest.raises(ArtifactError, match=pattern):
            load(bad)
    with pytest.raises(ArtifactError, match="cannot read"):
        load(tmp_path / "missing.tvmdpu")


def test_other_dpu_fingerprint_is_refused(built):
    _, _, path = built
    other = load_arch("DPUCZDX8G_ISA1_B1152")
    with pytest.raises(ArtifactError, match=r"built for DPU fingerprint 0x[0-9a-f]+ .* recompile"):
        load(path, device=EmulatorDevice(other))
    with pytest.raises(ArtifactError, match="expected 'emulator', 'pynq'"):
        load(path, device="gpu")


def _repack(path, tmp_path, edit, name):
    c = unpack(path.read_bytes(), MAGIC, FORMAT_VERSION, str(path), "tvm-dpu artifact", "tvm-dpu-artifact")
    header = {k: v for k, v in c.header.items() if k != "sections"}
    sections = {n: c.section(n) for n in c.header["sections"]}
    edit(header, sections)
    out = tmp_path / name
    out.write_bytes(pack(MAGIC, FORMAT_VERSION, header, sections))
    return out


def test_consistent_but_wrong_content(built, tmp_path):
    """Files whose checksums are right but whose content is not an artifact we can run."""
    _, _, path = built

    def no_lib_for_this_machine(h, s):
        s["lib.riscv64"] = s.pop(f"lib.{artifact.host_machine()}")
        h["cpu_libs"] = {"riscv64": "lib.riscv64"}

    def arch_lies(h, s):
        h["arch"]["fingerprint"] = hex(load_arch("DPUCZDX8G_ISA1_B512").fingerprint)

    def missing_key(h, s):
        del h["subgraphs"][0]["key"]

    def unknown_symbol(h, s):
        h["subgraphs"][0]["symbol"] = "fused_not_there_dpu"

    for edit, pattern in [(no_lib_for_this_machine, r"no library for this machine .*riscv64"),
                          (unknown_symbol, "library holds DPU programs the header does not list"),
                          (arch_lies, "has fingerprint .* but the artifact says"),
                          (missing_key, r"malformed artifact header: subgraphs\[0\]\.key must be a non-empty string")]:
        with pytest.raises(ArtifactError, match=pattern):
            load(_repack(path, tmp_path, edit, edit.__name__))


def test_loading_executes_nothing_but_the_checked_cpu_library():
    src = open(artifact.__file__).read() + open(sys.modules["tvm_dpu.security.container"].__file__).read()
    for forbidden in ("pickle", "eval(", "exec(", "marshal", "importlib"):
        assert forbidden not in src


def test_artifacts_are_deterministic(built, tmp_path):
    """Two builds of one model give byte-identical artifacts (library with the DPU programs included)."""
    _, _, path = built
    _, again = _build()
    path2 = again.export(tmp_path / "again.tvmdpu")
    c1 = unpack(path.read_bytes(), MAGIC, FORMAT_VERSION, "a", "tvm-dpu artifact", "tvm-dpu-artifact")
    c2 = unpack(path2.read_bytes(), MAGIC, FORMAT_VERSION, "b", "tvm-dpu artifact", "tvm-dpu-artifact")
    assert sorted(c1.header["sections"]) == sorted(c2.header["sections"])
    for n in c1.header["sections"]:
        assert c1.section(n) == c2.section(n), n
    assert path.read_bytes() == path2.read_bytes()


@pytest.mark.skipif(shutil.which("aarch64-linux-gnu-gcc") is None,
                    reason="no aarch64 cross toolchain (apt-get install gcc-aarch64-linux-gnu)")
def test_cross_compiled_cpu_library_is_aarch64(built, tmp_path):
    model, compiled, _ = built
    path = compiled.export(tmp_path / "board.tvmdpu", cross="aarch64")
    header, sizes = read_header(path)
    assert header["cpu_libs"]["aarch64"] == "lib.aarch64"
    c = unpack(path.read_bytes(), MAGIC, FORMAT_VERSION, "x", "tvm-dpu artifact", "tvm-dpu-artifact")
    assert elf_machine(c.section("lib.aarch64")) == 183
    host = artifact.host_machine()
    assert elf_machine(c.section(f"lib.{host}")) == ELF_MACHINES[host]
    # The board's library carries the same DPU programs as the host's.
    from tvm_dpu.security.program_blob import find_blobs

    board = {p.symbol: p.digest for p in find_blobs(c.section("lib.aarch64"), "aarch64")}
    assert board == {p.symbol: p.digest for p in find_blobs(c.section(f"lib.{host}"), host)} and board
    x = zoo.random_input(model, seed=2)  # the host still runs it, with its own library
    np.testing.assert_array_equal(load(path).run(x)[0], compiled.run(x)[0])


def test_cross_compile_errors(built, tmp_path, monkeypatch):
    _, compiled, _ = built
    with pytest.raises(ArtifactError, match="unknown cross target"):
        compiled.export(tmp_path / "x.tvmdpu", cross="mips")
    loaded = load(built[2])
    if shutil.which("aarch64-linux-gnu-gcc") is not None:
        with pytest.raises(ArtifactError, match="Relax module"):
            loaded.export(tmp_path / "y.tvmdpu", cross="aarch64")
    monkeypatch.setattr("tvm_dpu.util.toolchains.shutil.which", lambda name: None)
    with pytest.raises(ArtifactError, match="apt-get install gcc-aarch64-linux-gnu"):
        compiled.export(tmp_path / "z.tvmdpu", cross="aarch64")


def test_export_without_verify_data(built, tmp_path):
    model, compiled, path = built
    lean = compiled.export(tmp_path / "lean.tvmdpu", verify_data=False)
    _, sizes = read_header(lean)
    _, full = read_header(path)
    assert not any(n.endswith(".xgraph") for n in sizes) and any(n.endswith(".xgraph") for n in full)
    assert lean.stat().st_size < path.stat().st_size
    m = load(lean)
    assert not m.can_verify and load(path).can_verify
    x = zoo.random_input(model, seed=4)
    np.testing.assert_array_equal(m.run(x)[0], compiled.run(x)[0])
    with pytest.raises(ArtifactError, match="no verification data"):
        m.set_verify(True)
