"""Compile memory: what a compile holds and when it lets go (issue 12: VGG-16 under 2 GiB peak RSS).

Each test pins one copy of the weights that used to stay alive: the ONNX proto's weights (read lazily from the
file, and freed once imported), the float XGraph's views of the Relax constants (no process-wide cache), the
packed program (the compiled subgraph's parameters are a view of it) and the artifact read back (sections are
views of the file's bytes).
"""
from __future__ import annotations

import gc
import weakref

import numpy as np
import onnx
import pytest
import tvm

import tvm_dpu
from tvm_dpu import zoo
from tvm_dpu.security.container import pack, section_span, unpack
from tvm_dpu.errors import FrontendError
from tvm_dpu.frontend import from_onnx
from tvm_dpu.frontend.onnx_import import NamedModel
from tvm_dpu.frontend.onnx_lazy import MIN_LAZY_BYTES, has_lazy_weights, load_lazy, read_tensor, with_weights

ARCH = "DPUCZDX8G_ISA1_B4096"


@pytest.fixture(scope="module")
def model() -> onnx.ModelProto:
    return zoo.build_model("resnet18", reduced=True)


@pytest.fixture(scope="module")
def model_path(model, tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("mem") / "resnet18.onnx"
    onnx.save(model, str(path))
    return str(path)


def _calib(model) -> list:
    return [zoo.random_input(model, seed=s) for s in range(2)]


# -- the ONNX file ------------------------------------------------------------------------------------------
def test_lazy_load_leaves_large_weights_in_the_file(model_path):
    lazy = load_lazy(model_path)
    full = onnx.load(model_path)
    assert has_lazy_weights(lazy)
    large = [t.name for t in full.graph.initializer
             if t.data_type == onnx.TensorProto.FLOAT and len(t.raw_data) >= MIN_LAZY_BYTES]
    assert large and all(not t.HasField("raw_data") for t in lazy.graph.initializer if t.name in large)
    assert lazy.ByteSize() < full.ByteSize() // 2
    # with_weights gives back exactly what onnx.load gives
    assert with_weights(lazy).SerializeToString() == full.SerializeToString()


def test_lazy_weight_reads_into_tvm_with_the_file_values(model_path):
    lazy = load_lazy(model_path)
    full = {t.name: onnx.numpy_helper.to_array(t) for t in onnx.load(model_path).graph.initializer}
    for t in lazy.graph.initializer:
        tensor = read_tensor(t)
        if tensor is None:
            assert t.HasField("raw_data") or len(t.float_data) or len(t.int64_data)
            continue
        assert isinstance(tensor, tvm.runtime.Tensor)
        np.testing.assert_array_equal(tensor.numpy(), full[t.name])


def test_lazy_import_equals_the_in_memory_import(model, model_path):
    a = from_onnx(model_path)
    b = from_onnx(model)
    tvm.ir.assert_structural_equal(a, b, map_free_vars=True)


def test_checker_judges_a_lazy_model_without_reading_its_weights(model, model_path, monkeypatch):
    """The checker sees the lazy model (its weights are not read again) and rejects what it rejects in the whole
    model, with the same message."""
    from tvm_dpu.frontend import onnx_lazy
    from tvm_dpu.frontend.onnx_import import _check_model

    def no_read(place, out):
        raise AssertionError(f"weights read: {place}")

    monkeypatch.setattr(onnx_lazy, "_read", no_read)
    _check_model(load_lazy(model_path), model_path)
    errors = []
    for m in (load_lazy(model_path), onnx.ModelProto.FromString(model.SerializeToString())):
        m.graph.node[1].input[0] = "undefined_tensor"
        with pytest.raises(FrontendError, match="onnx.checker rejected the model") as e:
            _check_model(m, "<model>")
        errors.append(str(e.value))
    assert errors[0] == errors[1]


def test_lazy_weight_that_does_not_fill_its_shape_is_named(model, tmp_path):
    big = next(t for t in model.graph.initializer if len(t.raw_data) >= MIN_LAZY_BYTES)
    bad = onnx.ModelProto.FromString(model.SerializeToString())
    t = next(t for t in bad.graph.initializer if t.name == big.name)
    t.dims[0] += 1  # raw_data one slice short of the declared shape
    path = tmp_path / "short.onnx"
    onnx.save(bad, str(path))
    with pytest.raises(FrontendError, match=rf"short.onnx: initializer '{big.name}' holds {len(big.raw_data)} bytes"):
        from_onnx(str(path))
    with pytest.raises(onnx.checker.ValidationError, match="raw_data size"):  # onnx's checker rejects it too
        onnx.checker.check_model(str(path))


def test_file_with_external_data_is_read_by_onnx(model, tmp_path):
    path = tmp_path / "ext.onnx"
    copy = onnx.ModelProto()
    copy.CopyFrom(model)  # saving as external data rewrites the proto it is given
    onnx.save(copy, str(path), save_as_external_data=True, all_tensors_to_one_file=True, location="ext.data",
              size_threshold=1024)
    lazy = load_lazy(str(path))
    assert not has_lazy_weights(lazy)  # onnx.load read the external file into the proto
    assert with_weights(lazy).SerializeToString() == onnx.load(str(path)).SerializeToString()


def test_unreadable_file_is_a_frontend_error(tmp_path):
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"\x0a\xff\xff\xff\xff\x0f not a model")
    with pytest.raises(FrontendError):
        from_onnx(str(bad))


def test_a_named_model_is_handed_over_once(model):
    proto = onnx.ModelProto()
    proto.CopyFrom(model)
    named = NamedModel(proto, "resnet18.onnx")
    del proto
    tvm_dpu.build(named, arch=ARCH, calibration=_calib(model), progress=False)
    # the build took the proto: whoever still holds the NamedModel (an argument tuple) does not hold the model
    assert named.proto is None
    with pytest.raises(FrontendError, match="handed over"):
        from_onnx(named)


# -- the float XGraph -----------------------------------------------------------------------------------------
def test_float_xgraph_weights_are_not_cached_beyond_the_graph(model):
    from tvm_dpu.backend.dpu_compile import dpu_functions
    from tvm_dpu.passes.from_relax import build_float_xgraph
    from tvm_dpu.passes.partition import partition_detailed

    part = partition_detailed(from_onnx(model), ARCH)
    sym, fn = next(iter(dpu_functions(part.module).items()))
    fs = build_float_xgraph(fn, sym)
    weights = [t.data for t in fs.graph.tensors.values() if t.data is not None]
    assert weights
    refs = [weakref.ref(w) for w in weights]
    del fs, weights
    gc.collect()
    assert all(r() is None for r in refs), "a cache keeps the float weights of a compiled graph alive"


# -- the packed program ---------------------------------------------------------------------------------------
def test_compiled_params_are_a_view_of_the_program(model):
    from tvm_dpu.backend.relax_pipeline import prepare_and_compile
    from tvm_dpu.security.program_blob import unpack_program

    result = prepare_and_compile(from_onnx(model), arch=ARCH, calibration=_calib(model))
    assert result.partitions
    for sym, p in result.partitions.items():
        blob = np.frombuffer(p.blob, np.uint8)
        # one copy of the parameters: the module's program tensor, which the compiled subgraph reads through
        assert p.sg.params.nbytes > 0 and np.shares_memory(p.sg.params, blob)
        assert not p.sg.params.flags.writeable
        np.testing.assert_array_equal(p.sg.params, unpack_program(p.blob, sym).sg.params)


def test_section_span_finds_a_section_without_copying():
    sections = {"a": b"x" * 100, "params": np.arange(1000, dtype=np.uint8) % 251}
    data = pack(b"TESTMAGC", 1, {"format": "t"}, sections)
    off, n = section_span(data, "params")
    assert bytes(data[off:off + n]) == sections["params"].tobytes()


def test_unpacked_sections_are_views_of_the_input():
    payload = np.arange(1 << 16, dtype=np.uint8)
    data = bytearray(pack(b"TESTMAGC", 1, {"format": "t"}, {"p": payload}))
    c = unpack(data, b"TESTMAGC", 1, "mem", "test", "t")
    view = c.view("p")
    assert np.shares_memory(np.frombuffer(view, np.uint8), np.frombuffer(data, np.uint8))
    assert view.readonly
    assert c.section("p") == payload.tobytes()


# -- the module handed to the pipeline -----------------------------------------------------------------------
def _has_float_convs(mod: tvm.IRModule) -> bool:
    return "R.nn.conv2d" in mod.script(show_meta=False)


@pytest.mark.parametrize("handed_over", [True, False])
def test_a_handed_over_module_lets_its_dpu_weights_go(model, handed_over):
    from tvm_dpu.backend.relax_pipeline import prepare_and_compile

    mod = from_onnx(model)
    before = mod.script(show_meta=False)
    result = prepare_and_compile(mod, arch=ARCH, calibration=_calib(model), handed_over=handed_over)
    assert result.partitions and result.report is not None
    if handed_over:
        # rewritten in place into the partitioned module whose DPU functions no longer hold their float body
        assert not _has_float_convs(mod)
    else:
        assert mod.script(show_meta=False) == before  # a caller's module is left as it was
    # either way the result carries the programs, not the float convs
    assert not _has_float_convs(result.module)


def test_build_leaves_a_users_module_as_it_was(model):
    mod = from_onnx(model)
    before = mod.script(show_meta=False)
    tvm_dpu.build(mod, arch=ARCH, calibration=_calib(model), progress=False)
    assert mod.script(show_meta=False) == before
