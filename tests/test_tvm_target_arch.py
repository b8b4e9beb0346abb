"""The DPU arch, calibration and fusion chosen the TVM way: a target tag per preset (the arch in the target's
`model`), PassContext config options, and `host=` cross compilation."""
from __future__ import annotations

import shutil
import tarfile
import warnings

import numpy as np
import pytest
import tvm
from tvm import relax
from tvm.relax.frontend.onnx import from_onnx as tvm_from_onnx

import tvm_dpu
from tvm_dpu import zoo
from tvm_dpu.arch import list_presets
from tvm_dpu.errors import DPUError
from tvm_dpu.backend.pass_config import CONFIG_OPTIONS, registered
from tvm_dpu.util.toolchains import elf_machine

AARCH64 = {"kind": "llvm", "mtriple": "aarch64-linux-gnu"}
needs_cross = pytest.mark.skipif(shutil.which("aarch64-linux-gnu-gcc") is None,
                                 reason="needs aarch64-linux-gnu-gcc (apt-get install gcc-aarch64-linux-gnu)")


@pytest.fixture(scope="module")
def model():
    return zoo.build_model("mixed_cnn")


def _compile(model, target, config=None, **options):
    """(DPUCompileResult, executable, calibration warnings) of tvm.compile through the "dpu" pipeline."""
    record: list = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with tvm.transform.PassContext(config=config or {}):
            ex = tvm.compile(tvm_from_onnx(model), target=target,
                             relax_pipeline=relax.get_pipeline("dpu", record=record, **options))
    return record[0], ex, [str(w.message) for w in caught if "calibration data" in str(w.message)]


def test_a_target_tag_per_preset():
    tags = tvm.target.tag.list_tags()
    for preset in list_presets():
        t = tvm.target.Target(f"dpu-{preset}")
        assert f"dpu-{preset}" in tags and str(t.attrs["model"]) == preset and list(t.keys) == ["dpu", "cpu"]
    assert "model" not in tvm.target.Target("dpu").attrs


def test_the_tag_chooses_the_arch(model):
    result, _, warned = _compile(model, "dpu-kv260", fusion="none")
    assert result.arch.name == "kv260" and warned  # random calibration still warns when nobody chose it
    assert _compile(model, "dpu", fusion="none")[0].arch.name == "DPUCZDX8G_ISA1_B4096"
    # the target attribute itself, without a tag
    target = tvm.target.Target({"kind": "llvm", "keys": ["dpu", "cpu"], "model": "ultra96"})
    assert _compile(model, target, fusion="none")[0].arch.name == "ultra96"


def test_plain_target_dpu_follows_the_tag(model):
    """tvm.compile(mod, target="dpu-<preset>") with no pipeline named: the DPU pipeline for that arch."""
    ex = tvm.compile(tvm_from_onnx(model), target="dpu-zcu104",
                     relax_pipeline=relax.get_pipeline("dpu", calibration="random", fusion="none"))
    from tvm_dpu.runtime.device import EmulatorDevice
    from tvm_dpu.arch import load_arch

    x = zoo.random_input(model, seed=2)
    vm = relax.VirtualMachine(ex, tvm.cpu())
    with tvm_dpu.use_device(EmulatorDevice(load_arch("zcu104"))):
        vm["main"](tvm.runtime.tensor(x))
    with tvm_dpu.use_device(EmulatorDevice(load_arch("ultra96"))), pytest.raises(Exception, match="fingerprint"):
        relax.VirtualMachine(ex, tvm.cpu())["main"](tvm.runtime.tensor(x))


def test_pass_config_options_are_registered():
    assert registered()
    known = tvm.transform.PassContext.list_configs()
    assert all(k in known for k in CONFIG_OPTIONS)
    with pytest.raises(TypeError):  # typed like TVM's own options
        tvm.transform.PassContext(config={"relax.dpu.arch": 4096})


def test_pass_config_chooses_arch_calibration_and_fusion(model, tmp_path):
    calib = np.random.default_rng(5).standard_normal((3, *zoo.input_shape("mixed_cnn")[1:])).astype(np.float32)
    np.savez(tmp_path / "calib.npz", **{model.graph.input[0].name: calib})
    result, ex, warned = _compile(model, "dpu", {"relax.dpu.arch": "zcu102",
                                                 "relax.dpu.calibration": str(tmp_path / "calib.npz"),
                                                 "relax.dpu.fusion": "greedy"})
    assert result.arch.name == "zcu102" and not warned
    assert {f["mode"] for f in result.info["fusion"].values()} == {"greedy"}
    # the same as giving the options to the pipeline
    _, ex2, _ = _compile(model, "dpu", arch="zcu102", calibration=str(tmp_path / "calib.npz"), fusion="greedy")
    x = tvm.runtime.tensor(zoo.random_input(model, seed=4))
    np.testing.assert_array_equal(relax.VirtualMachine(ex, tvm.cpu())["main"](x).numpy(),
                                  relax.VirtualMachine(ex2, tvm.cpu())["main"](x).numpy())
    # random calibration chosen knowingly: no warning
    assert not _compile(model, "dpu", {"relax.dpu.calibration": "random"}, fusion="none")[2]


def test_two_different_archs_are_an_error(model):
    with pytest.raises(DPUError, match="'zcu102' by the pipeline's arch option and 'kv260' by the target's model"):
        _compile(model, "dpu-kv260", arch="zcu102")
    with pytest.raises(DPUError, match='PassContext config "relax.dpu.arch"'):
        _compile(model, "dpu-kv260", {"relax.dpu.arch": "ultra96"})
    # the same arch named twice is fine
    assert _compile(model, "dpu-kv260", {"relax.dpu.arch": "kv260"}, fusion="none")[0].arch.name == "kv260"


def test_build_accepts_the_tags(model):
    compiled = tvm_dpu.build(model, target="dpu-ultra96", calibration="random", fusion="none", progress=False)
    assert compiled.arch.name == "ultra96"
    with pytest.raises(DPUError, match="'dpu' or a per-preset tag"):
        tvm_dpu.build(model, target="llvm", calibration="random")


# ------------------------------------------------------------------------------------------------- host=
def _objects(ex, tmp_path) -> dict[str, int | None]:
    """ELF machine of every object TVM's export puts in a tar (no linking needed; C sources are left out)."""
    path = tmp_path / "m.tar"
    ex.export_library(str(path))
    with tarfile.open(path) as tf:
        return {m.name: elf_machine(tf.extractfile(m).read()) for m in tf.getmembers()
                if m.isfile() and m.name.endswith(".o")}


@needs_cross
def test_host_target_builds_every_object_for_the_host(model, tmp_path):
    _, ex, _ = _compile(model, tvm.target.Target("dpu-zcu102", host=AARCH64), calibration="random", fusion="none")
    machines = _objects(ex, tmp_path)
    assert machines and set(machines.values()) == {183}, machines  # EM_AARCH64; was 62 (x86-64) for the kernels


@needs_cross
def test_host_form_links_like_the_llvm_mtriple_form(model, tmp_path):
    from tvm.support import cc as tvm_cc

    libs = []
    for i, target in enumerate((tvm.target.Target("dpu-zcu102", host=AARCH64),
                                tvm.target.Target({**AARCH64, "keys": ["dpu", "cpu"], "model": "zcu102"}))):
        _, ex, _ = _compile(model, target, calibration="random", fusion="none")
        ex.export_library(str(tmp_path / f"{i}.so"), fcompile=tvm_cc.cross_compiler("aarch64-linux-gnu-gcc"))
        libs.append((tmp_path / f"{i}.so").read_bytes())
    assert elf_machine(libs[0]) == 183 and libs[0] == libs[1]


def test_missing_cross_compiler_is_a_clear_error(model, monkeypatch):
    import tvm_dpu.util.toolchains as toolchains

    real = toolchains.shutil.which
    monkeypatch.setattr(toolchains.shutil, "which", lambda cmd, *a, **k: None if "aarch64" in cmd else real(cmd))
    with pytest.raises(DPUError, match="needs the cross compiler 'aarch64-linux-gnu-gcc' on PATH"):
        _compile(model, tvm.target.Target("dpu-zcu102", host=AARCH64), calibration="random", fusion="none")


def _fresh_process(env_extra: dict, code: str) -> str:
    import os
    import subprocess
    import sys

    env = {**os.environ, **env_extra}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


_PROBE = ("import tvm, tvm_dpu\nfrom tvm_dpu.backend.pass_config import registered\n"
          "print(registered(), 'relax.dpu.arch' in tvm.transform.PassContext.list_configs())")


@pytest.mark.slow
def test_config_options_need_a_private_cache_and_a_compiler(tmp_path):
    """The registration library is compiled into the user's cache and loaded from there only when that is the
    user's own and writable by nobody else; without a C++ compiler the options are simply absent."""
    import os

    cache = tmp_path / "cache"
    assert _fresh_process({"TVM_DPU_CACHE_DIR": str(cache)}, _PROBE) == "True True"
    assert [p.name for p in cache.iterdir() if p.suffix == ".so"]  # compiled once, reused by the next import
    assert _fresh_process({"TVM_DPU_CACHE_DIR": str(cache), "CXX": "/nonexistent/c++"}, _PROBE) == "True True"
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o777)
    assert _fresh_process({"TVM_DPU_CACHE_DIR": str(shared)}, _PROBE) == "False False"
    assert _fresh_process({"TVM_DPU_CACHE_DIR": str(tmp_path / "none"), "CXX": "/nonexistent/c++"},
                          _PROBE) == "False False"


@pytest.mark.slow
def test_damaged_or_fifo_cached_library_is_rebuilt(tmp_path):
    """A truncated cached registration library is rebuilt (the options were silently missing before), and a FIFO
    in its place neither hangs the import nor is loaded: it is replaced by a freshly built library."""
    import os

    cache = tmp_path / "cache"
    assert _fresh_process({"TVM_DPU_CACHE_DIR": str(cache)}, _PROBE) == "True True"
    (lib,) = [p for p in cache.iterdir() if p.suffix == ".so"]
    lib.write_bytes(lib.read_bytes()[:100])
    assert _fresh_process({"TVM_DPU_CACHE_DIR": str(cache)}, _PROBE) == "True True"
    assert lib.stat().st_size > 100
    lib.unlink()
    os.mkfifo(lib)
    assert _fresh_process({"TVM_DPU_CACHE_DIR": str(cache)}, _PROBE) == "True True"
    assert lib.is_file()
