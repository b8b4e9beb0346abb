"""Tests of the model zoo generator (tvm_dpu.zoo): validity, topology, conditioning, determinism, files."""
from __future__ import annotations

import collections
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from tvm_dpu import zoo

REPO = Path(__file__).resolve().parents[1]
NETWORKS = ("vgg16", "resnet18", "resnet50", "resnet152", "googlenet", "mobilenetv2", "resnext50_32x4d",
            "mobilenetv3_small", "squeezenet1_1", "shufflenetv2", "mobilenetv3_large", "efficientnet_b0",
            "yolov3_tiny", "unet")
# Output shape per class count when it is not (1, classes): detection heads and per-pixel scores.
OUTPUT_SHAPES = {
    "yolov3_tiny": lambda classes, full: (1, 3 * (5 + classes), 13 * 13 + 26 * 26 if full else 2 * 2 + 4 * 4),
    "unet": lambda classes, full: (1, classes, 256, 256) if full else (1, classes, 64, 64),
}

# Op counts of the published topologies (ResNet: conv incl. downsample; MobileNetV2: 1 stem + 16 expand + 17
# depthwise + 17 project + 1 final conv; GoogLeNet: 3 stem convs + 6 per inception module).
EXPECTED_OPS: dict[str, dict[str, int]] = {
    "vgg16": {"Conv": 13, "Relu": 15, "MaxPool": 5, "Gemm": 3, "Dropout": 2, "Flatten": 1},
    "resnet18": {"Conv": 20, "BatchNormalization": 20, "Add": 8, "Relu": 17, "MaxPool": 1, "GlobalAveragePool": 1,
                 "Gemm": 1},
    "resnet50": {"Conv": 53, "BatchNormalization": 53, "Add": 16, "Relu": 49, "MaxPool": 1, "Gemm": 1},
    "resnet152": {"Conv": 155, "BatchNormalization": 155, "Add": 50, "Relu": 151, "MaxPool": 1, "Gemm": 1},
    "googlenet": {"Conv": 57, "Relu": 57, "Concat": 9, "MaxPool": 13, "LRN": 0, "GlobalAveragePool": 1,
                  "Dropout": 1, "Gemm": 1},
    "mobilenetv2": {"Conv": 52, "BatchNormalization": 52, "Clip": 35, "Add": 10, "GlobalAveragePool": 1, "Gemm": 1},
    "resnext50_32x4d": {"Conv": 53, "BatchNormalization": 53, "Add": 16, "Relu": 49, "MaxPool": 1, "Gemm": 1},
    # 1 stem + 11 blocks (10 expand, 11 depthwise, 9 SE x 2 fc, 11 project) + 1 last conv; 9 SE (HardSigmoid * x)
    "mobilenetv3_small": {"Conv": 52, "BatchNormalization": 34, "HardSwish": 19, "Relu": 14, "HardSigmoid": 9,
                          "Mul": 9, "Add": 6, "GlobalAveragePool": 10, "Gemm": 2},
    "squeezenet1_1": {"Conv": 26, "Relu": 26, "Concat": 8, "MaxPool": 3, "GlobalAveragePool": 1},
    # 16 units (3 downsampling), each ending in concat + channel shuffle (Reshape, Transpose, Reshape)
    "shufflenetv2": {"Conv": 56, "BatchNormalization": 56, "Concat": 16, "Split": 13, "Reshape": 32, "Transpose": 16,
                     "Gemm": 1},
    "mobilenetv3_large": {"Conv": 62, "BatchNormalization": 46, "HardSwish": 21, "Relu": 19, "HardSigmoid": 8,
                          "Mul": 8, "Add": 10, "GlobalAveragePool": 9, "Gemm": 2},
    # 16 MBConv blocks (15 expand, 16 depthwise, 16 SE x 2 fc, 16 project) + stem + head; SiLU = Sigmoid + Mul
    # (49 of them) and 16 SE gates (Sigmoid, Mul)
    "efficientnet_b0": {"Conv": 81, "BatchNormalization": 49, "Sigmoid": 65, "Mul": 65, "Add": 9,
                        "GlobalAveragePool": 17, "Gemm": 1},
    # 13 convs (11 conv+BN+leaky, 2 linear heads), 6 max pools, one 2x nearest upsample, the route concat and the
    # concat of the two flattened heads
    "yolov3_tiny": {"Conv": 13, "BatchNormalization": 11, "LeakyRelu": 11, "MaxPool": 6, "Resize": 1, "Concat": 2,
                    "Reshape": 2},
    "unet": {"Conv": 19, "BatchNormalization": 18, "Relu": 18, "MaxPool": 4, "ConvTranspose": 4, "Concat": 4},
    "mixed_cnn": {"Conv": 6, "Add": 1, "Concat": 1, "MaxPool": 2, "LeakyRelu": 1, "Sigmoid": 1, "Softmax": 1,
                  "Gemm": 1},
}
# Published parameter counts (torchvision; Caffe BVLC GoogLeNet without auxiliary heads ~7.0M).
PUBLISHED_PARAMS = {"resnet18": 11_689_512, "resnet50": 25_557_032, "resnet152": 60_192_808, "vgg16": 138_357_544,
                    "mobilenetv2": 3_504_872, "googlenet": 7.0e6, "resnext50_32x4d": 25_028_904,
                    "mobilenetv3_small": 2_542_856, "squeezenet1_1": 1_235_496, "shufflenetv2": 2_278_604,
                    "mobilenetv3_large": 5_483_032, "efficientnet_b0": 5_288_548}
FAST_FULL = ("resnet18", "googlenet", "mobilenetv2", "mobilenetv3_small", "squeezenet1_1", "shufflenetv2",
             "mobilenetv3_large", "efficientnet_b0")  # full-size builds well under a second


def _session(model: onnx.ModelProto) -> ort.InferenceSession:
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1  # the machine is shared
    return ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])


def _run_with_stages(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    """Run ``model`` in onnxruntime on its random input, also returning every stage-end tensor."""
    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    stages = zoo.stage_outputs(model)
    for name in stages:
        probe.graph.output.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, None))
    outs = _session(probe).run(None, {"input": zoo.random_input(model)})
    return dict(zip(["output", *stages], outs))


def _expected_output(name: str, full: bool) -> tuple[int, ...]:
    """(1, classes) for a classifier (1000 / 10 classes), else the detector's / segmenter's output shape."""
    if name not in OUTPUT_SHAPES:
        return (1, 1000 if full else 10)
    info = zoo.REGISTRY[name]
    return OUTPUT_SHAPES[name]((info.full if full else info.reduced).classes, full)


def _op_counts(model: onnx.ModelProto) -> collections.Counter:
    return collections.Counter(n.op_type for n in model.graph.node)


def _check_model(name: str, model: onnx.ModelProto, classes: int) -> None:
    onnx.checker.check_model(model, full_check=True)
    assert model.ir_version == 8
    assert [(o.domain, o.version) for o in model.opset_import] == [("", 17)]
    assert [i.name for i in model.graph.input] == ["input"]
    assert [o.name for o in model.graph.output] == ["output"]
    assert model.graph.input[0].type.tensor_type.elem_type == TensorProto.FLOAT
    names = [n.name for n in model.graph.node]
    assert all(names) and len(set(names)) == len(names), "node names must be present and unique"
    counts = _op_counts(model)
    for op, expected in EXPECTED_OPS[name].items():
        assert counts.get(op, 0) == expected, f"{name}: {op} count {counts.get(op, 0)} != {expected}"
    results = _run_with_stages(model)
    out = results["output"]
    assert out.shape == _expected_output(name, full=classes != 10)
    assert np.isfinite(out).all()
    assert len(results) >= 3, "each model marks at least two stages"
    for tensor, value in results.items():
        std = float(value.std())
        assert np.isfinite(value).all(), f"{name}: {tensor} not finite"
        assert 1e-2 <= std <= 1e2, f"{name}: activation std at {tensor} is {std:.3g}"


# ---------------------------------------------------------------------------------------------------------------
# API
# ---------------------------------------------------------------------------------------------------------------
def test_models_tuple_lists_every_network_and_the_demo():
    assert set(zoo.MODELS) == set(NETWORKS) | {"mixed_cnn"}


def test_unknown_name_lists_available_models():
    with pytest.raises(ValueError, match="unknown zoo model 'alexnet'.*resnet50.*mobilenetv2"):
        zoo.build_model("alexnet")
    with pytest.raises(ValueError, match="vgg16"):
        zoo.input_shape("nope")
    with pytest.raises(ValueError, match="resnet18"):
        zoo.save_zoo("/nonexistent-dir-never-written", names=["resnet18", "bogus"])


def test_unknown_option_and_bad_batch_are_rejected():
    with pytest.raises(ValueError, match="resnet18.*lrn.*accepted: none"):
        zoo.build_model("resnet18", reduced=True, lrn=True)
    with pytest.raises(ValueError, match="googlenet.*width.*accepted: lrn"):
        zoo.build_model("googlenet", reduced=True, width=2)
    with pytest.raises(ValueError, match="batch"):
        zoo.build_model("resnet18", reduced=True, batch=0)


def test_input_shape():
    assert zoo.input_shape("resnet50") == (1, 3, 224, 224)
    assert zoo.input_shape("resnet50", reduced=True) == (1, 3, 64, 64)
    assert zoo.input_shape("mixed_cnn") == (1, 3, 64, 64)
    model = zoo.build_model("vgg16", reduced=True)
    dims = tuple(d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim)
    assert dims == zoo.input_shape("vgg16", reduced=True)


def test_random_input_shapes_and_determinism():
    a = zoo.random_input("googlenet", seed=3)
    assert a.shape == (1, 3, 224, 224) and a.dtype == np.float32
    assert zoo.random_input("googlenet", seed=3, reduced=True).shape == (1, 3, 64, 64)
    model = zoo.build_model("mobilenetv2", reduced=True, batch=2)
    x = zoo.random_input(model, seed=1)
    assert x.shape == (2, 3, 64, 64)
    np.testing.assert_array_equal(x, zoo.random_input(model, seed=1))
    assert not np.array_equal(x, zoo.random_input(model, seed=2))
    with pytest.raises(ValueError):
        zoo.random_input("nope")


# ---------------------------------------------------------------------------------------------------------------
# Every model, reduced variant: valid, runs, right topology, well-conditioned
# ---------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", zoo.MODELS)
def test_reduced_model_is_valid_runs_and_is_well_conditioned(name):
    _check_model(name, zoo.build_model(name, reduced=True), classes=10)


@pytest.mark.parametrize("name", [n for n in NETWORKS if n != "vgg16"])
def test_reduced_variant_has_the_full_op_sequence(name):
    full, small = zoo.build_model(name), zoo.build_model(name, reduced=True)
    assert [(n.name, n.op_type) for n in small.graph.node] == [(n.name, n.op_type) for n in full.graph.node]
    dims = tuple(d.dim_value for d in full.graph.output[0].type.tensor_type.shape.dim)
    assert dims == _expected_output(name, full=True)


def test_depthwise_convs_of_mobilenetv2():
    model = zoo.build_model("mobilenetv2", reduced=True)
    inits = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    depthwise = []
    for node in model.graph.node:
        if node.op_type != "Conv":
            continue
        group = next((a.i for a in node.attribute if a.name == "group"), 1)
        w = inits[node.input[1]]
        if group > 1:
            assert w.shape[0] == group and w.shape[1] == 1, f"{node.name}: group {group} but weight {w.shape}"
            depthwise.append(node.name)
    assert len(depthwise) == 17
    clips = [n for n in model.graph.node if n.op_type == "Clip"]
    for node in clips:  # ReLU6 as Clip with min/max inputs
        assert len(node.input) == 3
        assert float(inits[node.input[1]]) == 0.0 and float(inits[node.input[2]]) == 6.0


def test_resnext_grouped_convs():
    """ResNeXt-50 32x4d: every bottleneck's 3x3 is a grouped conv (32 groups of 4 x 2**(stage-1) channels full size;
    the reduced variant keeps 4-channel groups with groups / 8)."""
    for reduced, groups, first_width in ((False, 32, 128), (True, 4, 16)):
        model = zoo.build_model("resnext50_32x4d", reduced=reduced)
        inits = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
        convs = [n for n in model.graph.node if n.op_type == "Conv" and n.name.endswith(".conv2")]
        assert len(convs) == 16
        for n in convs:
            assert next(a.i for a in n.attribute if a.name == "group") == groups
        assert inits[convs[0].input[1]].shape == (first_width, first_width // groups, 3, 3)


def test_mobilenetv3_se_and_shufflenet_shuffle_structure():
    model = zoo.build_model("mobilenetv3_small", reduced=True)
    shapes = {vi.name: [d.dim_value for d in vi.type.tensor_type.shape.dim]
              for vi in onnx.shape_inference.infer_shapes(model).graph.value_info}
    for n in (n for n in model.graph.node if n.op_type == "Mul"):  # x * gate, gate N x C x 1 x 1
        gate = shapes[n.input[1]]
        assert gate[2:] == [1, 1] and gate[:2] == shapes[n.input[0]][:2]
    hs = [n for n in model.graph.node if n.op_type == "HardSigmoid"]
    assert all(next(a.f for a in n.attribute if a.name == "alpha") == pytest.approx(1 / 6) for n in hs)
    model = zoo.build_model("shufflenetv2", reduced=True)
    perms = [list(next(a.ints for a in n.attribute if a.name == "perm")) for n in model.graph.node
             if n.op_type == "Transpose"]
    assert perms == [[0, 2, 1, 3, 4]] * 16


def test_resnet_names_and_v15_stride_placement():
    model = zoo.build_model("resnet50", reduced=True)
    nodes = {n.name: n for n in model.graph.node}
    for name in ("conv1", "bn1", "maxpool", "layer1.0.conv1", "layer1.0.bn1", "layer1.0.downsample.0",
                 "layer1.0.downsample.1", "layer4.2.add", "avgpool", "fc"):
        assert name in nodes

    def strides(n):
        return next(list(a.ints) for a in nodes[n].attribute if a.name == "strides")

    # v1.5: the stride of a downsampling bottleneck sits on its 3x3 conv, not on the first 1x1.
    assert strides("layer2.0.conv1") == [1, 1] and strides("layer2.0.conv2") == [2, 2]
    assert strides("layer2.0.downsample.0") == [2, 2]
    for node in model.graph.node:
        if node.op_type == "Conv":
            assert len(node.input) == 2, f"{node.name}: ResNet convs have no bias (BN follows)"
    # every conv output feeds a BatchNormalization
    consumers = collections.defaultdict(list)
    for node in model.graph.node:
        for i in node.input:
            consumers[i].append(node.op_type)
    for node in model.graph.node:
        if node.op_type == "Conv":
            assert consumers[node.output[0]] == ["BatchNormalization"]


def test_batchnorm_statistics_follow_the_specified_distributions():
    model = zoo.build_model("resnet18")
    inits = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    bns = [n for n in model.graph.node if n.op_type == "BatchNormalization"]
    gamma = np.concatenate([inits[n.input[1]] for n in bns])
    beta = np.concatenate([inits[n.input[2]] for n in bns])
    mean = np.concatenate([inits[n.input[3]] for n in bns])
    var = np.concatenate([inits[n.input[4]] for n in bns])
    for u in (gamma, var):
        assert u.min() >= 0.5 and u.max() <= 1.5 and abs(u.mean() - 1.0) < 0.02
    for g in (beta, mean):
        assert abs(g.mean()) < 0.01 and 0.09 < g.std() < 0.11


def test_googlenet_inception_structure_and_lrn_option():
    plain = zoo.build_model("googlenet", reduced=True)
    names = {n.name for n in plain.graph.node}
    for branch in ("1x1", "3x3_reduce", "3x3", "5x5_reduce", "5x5", "pool", "pool_proj", "output"):
        for module in ("3a", "4e", "5b"):
            assert f"inception_{module}/{branch}" in names
    pool = next(n for n in plain.graph.node if n.name == "inception_3a/pool")
    attrs = {a.name: list(a.ints) for a in pool.attribute}
    assert attrs["kernel_shape"] == [3, 3] and attrs["strides"] == [1, 1] and attrs["pads"] == [1, 1, 1, 1]
    with_lrn = zoo.build_model("googlenet", reduced=True, lrn=True)
    lrns = [n.name for n in with_lrn.graph.node if n.op_type == "LRN"]
    assert lrns == ["pool1/norm1", "conv2/norm2"]
    onnx.checker.check_model(with_lrn, full_check=True)
    out = _session(with_lrn).run(None, {"input": zoo.random_input(with_lrn)})[0]
    assert out.shape == (1, 10) and np.isfinite(out).all()


def test_googlenet_explicit_pads_equal_caffe_ceil_mode_pooling():
    model = zoo.build_model("googlenet", reduced=True)
    ceil = onnx.ModelProto()
    ceil.CopyFrom(model)
    rewritten = 0
    for node in ceil.graph.node:
        if node.op_type == "MaxPool" and node.name.endswith("3x3_s2"):
            for a in node.attribute:
                if a.name == "pads":
                    assert list(a.ints) == [0, 0, 1, 1]
                    a.ints[:] = [0, 0, 0, 0]
            node.attribute.append(helper.make_attribute("ceil_mode", 1))
            rewritten += 1
    assert rewritten == 4
    x = zoo.random_input(model)
    np.testing.assert_array_equal(_session(model).run(None, {"input": x})[0],
                                  _session(ceil).run(None, {"input": x})[0])


def test_mixed_cnn_has_the_partitioning_features():
    model = zoo.build_model("mixed_cnn")
    nodes = list(model.graph.node)
    producer = {o: n for n in nodes for o in n.output}
    consumers = collections.defaultdict(list)
    for n in nodes:
        for i in n.input:
            consumers[i].append(n)
    big = [n for n in nodes if n.op_type == "Conv"
           and next(list(a.ints) for a in n.attribute if a.name == "kernel_shape") == [17, 17]]
    assert len(big) == 1
    leaky = next(n for n in nodes if n.op_type == "LeakyRelu")
    assert next(a.f for a in leaky.attribute if a.name == "alpha") == pytest.approx(0.1)
    # a lone Relu between two CPU-only ops: 17x17 conv -> Relu -> Sigmoid
    relu = [c for c in consumers[big[0].output[0]] if c.op_type == "Relu"]
    assert len(relu) == 1 and [c.op_type for c in consumers[relu[0].output[0]]] == ["Sigmoid"]
    assert producer["output"].op_type == "Softmax"
    out = _session(model).run(None, {"input": zoo.random_input(model)})[0]
    np.testing.assert_allclose(out.sum(axis=1), 1.0, rtol=1e-5)
    assert len(model.SerializeToString()) < 1_000_000


# ---------------------------------------------------------------------------------------------------------------
# Determinism, batch, files
# ---------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["resnet152", "googlenet", "mixed_cnn"])
def test_same_arguments_give_identical_bytes(name):
    a = zoo.build_model(name, reduced=True, seed=5).SerializeToString()
    assert a == zoo.build_model(name, reduced=True, seed=5).SerializeToString()
    assert a != zoo.build_model(name, reduced=True, seed=6).SerializeToString()


def test_batch_dimension():
    model = zoo.build_model("resnet18", reduced=True, batch=3)
    onnx.checker.check_model(model, full_check=True)
    x = zoo.random_input(model)
    out = _session(model).run(None, {"input": x})[0]
    assert out.shape == (3, 10)
    single = _session(zoo.build_model("resnet18", reduced=True)).run(None, {"input": x[1:2]})[0]
    np.testing.assert_allclose(out[1:2], single, rtol=1e-4, atol=1e-5)


def test_stage_outputs_name_real_tensors():
    model = zoo.build_model("resnet18", reduced=True)
    stages = zoo.stage_outputs(model)
    assert stages == ("maxpool", "layer1.1.relu", "layer2.1.relu", "layer3.1.relu", "layer4.1.relu")
    produced = {o for n in model.graph.node for o in n.output}
    assert set(stages) <= produced
    assert zoo.stage_outputs(onnx.ModelProto()) == ()


def test_save_model_and_save_zoo(tmp_path):
    path = zoo.save_model("googlenet", tmp_path / "sub" / "g.onnx", reduced=True, seed=2)
    assert path.read_bytes() == zoo.build_model("googlenet", reduced=True, seed=2).SerializeToString()
    paths = zoo.save_zoo(tmp_path / "z", names=["mixed_cnn", "mobilenetv2"], reduced=True)
    assert [p.name for p in paths] == ["mixed_cnn_small.onnx", "mobilenetv2_small.onnx"]
    for p, name in zip(paths, ["mixed_cnn", "mobilenetv2"]):
        assert onnx.load(p).SerializeToString() == zoo.build_model(name, reduced=True).SerializeToString()


def test_module_entry_point_writes_files(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "tvm_dpu.zoo", str(tmp_path), "--reduced", "--names", "resnet18",
                           "mixed_cnn"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "resnet18_small.onnx").read_bytes() == \
        zoo.build_model("resnet18", reduced=True).SerializeToString()
    assert (tmp_path / "mixed_cnn_small.onnx").exists()
    bad = subprocess.run([sys.executable, "-m", "tvm_dpu.zoo", str(tmp_path), "--names", "alexnet"],
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode != 0 and "alexnet" in bad.stderr


def test_bundled_examples_match_the_generator():
    """examples/ must be exactly what the command in examples/README.md writes."""
    readme = (REPO / "examples" / "README.md").read_text()
    assert "python -m tvm_dpu.zoo examples --names mixed_cnn" in readme
    assert "python -m tvm_dpu.zoo examples --reduced --names resnet18" in readme
    for file, name, reduced in (("mixed_cnn.onnx", "mixed_cnn", False), ("resnet18_small.onnx", "resnet18", True)):
        data = (REPO / "examples" / file).read_bytes()
        assert len(data) < 1_100_000
        assert data == zoo.build_model(name, reduced=reduced).SerializeToString(), f"examples/{file} is stale"


# ---------------------------------------------------------------------------------------------------------------
# Full-size models
# ---------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", FAST_FULL)
def test_parameter_count_matches_published(name):
    assert zoo.count_parameters(zoo.build_model(name)) == pytest.approx(PUBLISHED_PARAMS[name], rel=0.01)


@pytest.mark.slow
@pytest.mark.parametrize("name", [n for n in PUBLISHED_PARAMS if n not in FAST_FULL])
def test_parameter_count_matches_published_large(name):
    model = zoo.build_model(name)
    assert zoo.count_parameters(model) == pytest.approx(PUBLISHED_PARAMS[name], rel=0.01)
    # running BN statistics and scalar constants do not move the total by more than the tolerance either
    total = sum(int(np.prod(t.dims)) for t in model.graph.initializer)
    assert total == pytest.approx(PUBLISHED_PARAMS[name], rel=0.01)


@pytest.mark.slow
@pytest.mark.parametrize("name", NETWORKS)
def test_full_model_is_valid_runs_and_is_well_conditioned(name):
    _check_model(name, zoo.build_model(name), classes=1000)


@pytest.mark.slow
def test_vgg16_reduced_variant_has_the_full_op_sequence():
    full, small = zoo.build_model("vgg16"), zoo.build_model("vgg16", reduced=True)
    assert [(n.name, n.op_type) for n in small.graph.node] == [(n.name, n.op_type) for n in full.graph.node]


@pytest.mark.slow
def test_full_size_determinism():
    assert zoo.build_model("resnet50").SerializeToString() == zoo.build_model("resnet50").SerializeToString()
