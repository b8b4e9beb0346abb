"""Full-size MobileNetV2 (224x224, KV260 B4096, vai_c 2.5's file; too large and unlicensed to vendor: set
TVM_DPU_XMODELS, PUBLIC_NETWORKS.txt / the scratch INDEX name it) rebuilt from its int8 constants and compiled by
tvm-dpu: the search chains its inverted-residual blocks (pw_dw_pw_add where the block has a residual, the stem conv
into block 1), and the program agrees bit for bit with the golden reference on every block output, with the
dependency checker clean."""
from __future__ import annotations

import os
import warnings
from pathlib import Path

import pytest

from tvm_dpu.arch.arch import arch_from_fingerprint
from tvm_dpu.backend.dpu_compile import compile_subgraph
from tvm_dpu.runtime.dep_check import check_programs
from tvm_dpu.xmodel.compare import rebuild_qdq
from tvm_dpu.xmodel.model import read_xmodel
from conftest import emulator_vs_golden

ROOT = Path(os.environ.get("TVM_DPU_XMODELS", "xmodels-not-vendored"))
MOBILENETV2 = "mobilenetv2_kv260_princesuman2004_177e8d7de00f9dc1bc600a009bb5001570449b5d.xmodel"


@pytest.mark.slow
def test_full_size_mobilenetv2_chains_its_blocks_bit_exact():
    import tvm_dpu

    path = ROOT / MOBILENETV2
    if not path.is_file():
        pytest.skip(f"{path} not present (set TVM_DPU_XMODELS)")
    xm = read_xmodel(path)
    (d,) = xm.dpu_subgraphs()
    arch = arch_from_fingerprint(d.fingerprint)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model, *_ = rebuild_qdq(xm, d)
        (runner,) = tvm_dpu.build(model, arch=arch, progress=False).runners.values()
    graph = runner.graph
    # every block output checked, not only the classifier's (all zero on random inputs)
    graph.outputs = list(dict.fromkeys(graph.outputs + [op.outputs[0] for op in graph.ops
                                                        if op.type == "eltwise_add"]))
    compiled, plan = compile_subgraph(graph, arch)
    templates = [g.template for g in plan.fused()]
    assert templates.count("pw_dw_pw_add") >= 3
    stem = graph.op(plan.fused()[0].ops[0])
    assert plan.fused()[0].template == "pw_dw_pw" and stem is graph.ops[0]  # the stem conv (3x3, stride 2)
    result = emulator_vs_golden(graph, arch, plan, seed=3)
    assert result.bad == 0, result.by_output
    for label, rep in check_programs(compiled, None, arch).items():
        assert rep.ok and rep.races_checked, (label, rep.problems[:3], rep.races[:3])
