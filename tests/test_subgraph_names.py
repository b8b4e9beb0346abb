"""DPU subgraphs are named after the first and last ONNX nodes they compute: short, unique, the same every build,
and shown by `inspect` instead of the Relax symbol (hundreds of characters)."""
from __future__ import annotations

from types import SimpleNamespace

import tvm_dpu
from tvm_dpu.backend.dpu_compile import NAME_PART_CHARS, readable_names
from tvm_dpu.cli import main

EXAMPLE = "examples/mixed_cnn.onnx"
CALIB = "examples/mixed_cnn_calib.npz"


def _names(model) -> dict[int, str]:
    return {model.subgraph_ids[sym]: r.sg.name for sym, r in model.runners.items()}


def test_subgraphs_are_named_after_their_first_and_last_onnx_nodes(tmp_path, capsys):
    model = tvm_dpu.build(EXAMPLE, arch="zcu102", calibration=CALIB, progress=False)
    nodes = model.partition_report.to_json()["nodes"]
    names = _names(model)
    for sid, name in names.items():
        mine = [n["name"] for n in nodes if n.get("device") == "dpu" and n.get("subgraph") == sid]
        assert name == f"{mine[0]}..{mine[-1]}"
    assert names == {0: "conv1..branch_a.leaky", 1: "concat..head.fc"}
    assert _names(tvm_dpu.build(EXAMPLE, arch="zcu102", calibration=CALIB, progress=False)) == names  # stable
    model.export(tmp_path / "m.tvmdpu")
    assert main(["inspect", str(tmp_path / "m.tvmdpu")]) == 0
    text = capsys.readouterr().out
    assert "subgraph 0 conv1..branch_a.leaky: " in text and "subgraph 1 concat..head.fc: " in text
    assert max(len(line) for line in text.splitlines()) < 200  # the 100s-of-characters symbol is cut short


def test_names_are_unique_short_and_in_graph_order():
    def graph(*sources):
        return SimpleNamespace(graph=SimpleNamespace(ops=[SimpleNamespace(source=list(s)) for s in sources]))

    long = "encoder/" + "block" * 30 + "/conv"
    order = {n: i for i, n in enumerate(["a", "b", "relu_b", "c", long, "z"])}
    got = readable_names({"s1": graph(["relu_b", "b"], ["c"]), "s2": graph(["b"], ["c"]), "s3": graph(["z"]),
                          "s4": graph([long], ["z"]), "s5": graph()}, order)
    assert got["s1"] == "b..c" and got["s2"] == "b..c#2" and got["s3"] == "z" and got["s5"] == "s5"
    assert got["s4"].endswith("..z") and got["s4"].startswith("encoder/") and \
        len(got["s4"]) <= NAME_PART_CHARS + len("..z")


def test_tvms_own_onnx_importer_carries_the_onnx_node_names():
    """`tvm.relax.frontend.onnx.from_onnx` with tvm_dpu loaded: the placement report and the subgraph names give
    the ONNX node names (not lv22 / gv), the same as tvm_dpu's own import."""
    import onnx
    from tvm.relax.frontend.onnx import from_onnx

    mod = from_onnx(onnx.load(EXAMPLE))
    theirs = tvm_dpu.partition(mod, "zcu102")[1]
    ours = tvm_dpu.partition(tvm_dpu.from_onnx(EXAMPLE), "zcu102")[1]
    assert [(n.name, n.op, n.device, n.subgraph) for n in theirs.nodes] == \
        [(n.name, n.op, n.device, n.subgraph) for n in ours.nodes]
    assert not [n.name for n in theirs.nodes if n.name.startswith(("lv", "gv"))]
    model = tvm_dpu.build(mod, arch="zcu102", calibration=CALIB, progress=False)
    assert _names(model) == {0: "conv1..branch_a.leaky", 1: "concat..head.fc"}
