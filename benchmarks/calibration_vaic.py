"""vai_c-program rows of the timing-model calibration (issue 23): our simulator on vai_c's OWN instructions.

The model-zoo rows of bench_calibration compare published latencies with the simulated time of *our* programs for
those networks, so the fit is partly circular: when our code generator gets faster, the fit raises the hardware
constants. These rows take the code generator out: the program simulated is the DPU subgraph vai_c compiled
(read from a public .xmodel by tvm_dpu.xmodel.read_xmodel), on the DPU its fingerprint names, at the clock and
DDR bandwidth of the board preset the published figure was measured on.

Each row says what its published figure covers (`use`):
* "fit": a figure that is the DPU's own per-frame time: multi-thread throughput of a single-core board, where the
  core runs frame after frame (1/fps is an upper bound of its per-frame time, equal when the core is the
  bottleneck; the `why` field gives the evidence that it is);
* "validation": held out: multi-core throughput (cores share the DDR, `active_cores`; the ARM may also limit it);
* "bound": an end-to-end figure that also covers ARM work (pre/post-processing, custom ops on the CPU, a Python
  loop): the simulated DPU time must not exceed it, and the difference is what the ARM would need.

The larger xmodels (> 1 MB) are not vendored: they are looked up in $TVM_DPU_XMODELS (tests/data/xmodel/
PUBLIC_NETWORKS.txt says where each comes from) and in tests/data/xmodel; a row whose file is missing is reported
as not available, never silently dropped.
"""
from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tvm_dpu.arch import Arch, arch_from_fingerprint, load_arch
from tvm_dpu.timing.params import TimingParams
from tvm_dpu.timing.simulate import simulate
from tvm_dpu.xmodel.model import read_xmodel

ROOT = Path(__file__).resolve().parents[1]
VENDORED = ROOT / "tests" / "data" / "xmodel"

#: Vitis AI 3.0 model zoo performance table (AMD), the row of pt_yolox-nano_coco_416_416_1G: "E2E throughput (fps)"
#: single / multi thread on ZCU102 (3 x B4096 @ 281 MHz), ZCU104 (2 x B4096 @ 300 MHz), KV260 (1 x B4096F @ 300 MHz).
ZOO30 = ("Xilinx/Vitis-AI tag v3.0 (commit 2057c588c241c3902353bc618afc8ab214d7aeed) "
         "docs/docs/reference/ModelZoo_VAI3.0_Github_web.htm, row pt_yolox-nano_coco_416_416_1G")
#: Vitis AI 2.5 model zoo README performance tables (AMD), row 58 pointpillars_kitti (pt_pointpillars_kitti_12000_
#: 100_10.8G): "E2E throughput (fps)" single / multi thread.
ZOO25 = ("Xilinx/Vitis-AI tag v2.5 (commit c26eae36f034d5a2f9b2a7bfe816b8c43311a4f8) model_zoo/README.md, "
         "'Performance on {board}' row 58 pointpillars_kitti")
PYNQ_MNIST = ("Xilinx/DPU-PYNQ commit 3d3678db25c50147a503b9afc2de1b17c017d674 pynq_dpu/notebooks/"
              "dpu_mnist_classifier.ipynb, stored output 'Throughput: 2756.2394FPS' (10,000 images)")

#: Vitis AI 2.5 model zoo README, 'Performance on Kria KV260 SOM' (AMD), No. 39 tf_mobilenetv2_1.0_imagenet_224_224_602M:
#: "E2E throughput (fps)" single / multi thread (benchmarks/data/published_figures.json holds the row).
ZOO25_KV260_MNV2 = ("Xilinx/Vitis-AI tag v2.5 (commit c26eae36f034d5a2f9b2a7bfe816b8c43311a4f8) model_zoo/README.md, "
                    "'Performance on Kria KV260 SOM' No. 39 tf_mobilenetv2_1.0_imagenet_224_224_602M")

YOLOX_B4096 = "yolox_nano_b4096_kv260-ubuntu-test_75f296b4ec8e95884c93db81778009db97cd788e.xmodel"
MOBILENETV2_B4096 = "mobilenetv2_kv260_princesuman2004_177e8d7de00f9dc1bc600a009bb5001570449b5d.xmodel"
POINTPILLARS_VAI25 = "pointpillars_custom_op_zcu102_09f6d01aec8eb27285d1ed9ebead86497d3be287.xmodel"
MNIST_PYNQ = "dpu_pynq/dpu_mnist_classifier.xmodel"

_MNV2_SAME = ("The xmodel is a community vai_c_xir 2.5 compile for KV260 B4096 of torchvision's MobileNetV2 (width 1.0, "
              "224x224; princesuman2004/Object-Classification-on-Kria-KV260, no licence: not vendored) with an 80-class "
              "classifier on the DPU; the zoo's tf_mobilenetv2_1.0 has 1001 classes, about 1.2 MB more FC weights "
              "(~0.12 ms of LOAD at the two ports' rate), so a right model reads this program a few % below the figure")
_YOLOX_SAME = ("The zoo measured vai_c 3.0's compile (yolox_nano_pt-zcu102_zcu104_kv260-r3.0.0); this xmodel is "
               "vai_c_xir 2.5's compile of the 3.5 zoo's quantized model (iotengineer22/kv260-ubuntu-test): same "
               "network (416x416, 1 GOP), not the same instruction stream")


@dataclass(frozen=True)
class VaicRow:
    """One published figure for a network of which a vai_c-compiled xmodel is at hand."""

    key: str
    network: str
    xmodel: str  # file name under $TVM_DPU_XMODELS or tests/data/xmodel
    board: str  # board preset: clock and DDR bandwidth (the DPU configuration comes from the fingerprint)
    metric: str  # "dpu_ms" (published ms per frame) | "fps" (published frames/s on `cores` cores) | "e2e_ms"
    published: float
    cores: int
    use: str  # "fit" | "validation" | "bound"
    source: str
    why: str


VAIC_ROWS: tuple[VaicRow, ...] = (
    VaicRow("yolox-nano kv260 1 core", "yolox-nano", YOLOX_B4096, "kv260", "dpu_ms", 1000 / 275.72, 1, "fit",
            ZOO30 + ", KV260 multi thread 275.72 fps",
            "one B4096 core fed by several threads runs frame after frame: 1/fps = 3.63 ms is its per-frame time "
            "(an upper bound, equal when the core is the bottleneck). It is: the single-thread figure (5.05 ms) "
            "leaves 1.42 ms of ARM work per frame, which four A53 cores serve at > 2,800 fps. " + _YOLOX_SAME),
    VaicRow("mobilenetv2 kv260 1 core", "mobilenetv2", MOBILENETV2_B4096, "kv260", "dpu_ms", 1000 / 336.82, 1, "fit",
            ZOO25_KV260_MNV2 + ", multi thread 336.82 fps",
            "one B4096 core fed by several threads: 1/fps = 2.97 ms is its per-frame time, equal when the core is "
            "the bottleneck. It is: the single-thread figure (3.44 ms) leaves 0.47 ms of ARM work per frame, which "
            "four A53 cores serve at > 8,000 fps. " + _MNV2_SAME),
    VaicRow("mobilenetv2 kv260 e2e", "mobilenetv2", MOBILENETV2_B4096, "kv260", "e2e_ms", 1000 / 290.62, 1, "bound",
            ZOO25_KV260_MNV2 + ", single thread 290.62 fps",
            "end to end: image pre-processing, the runner's I/O and softmax on the ARM, plus the DPU"),
    VaicRow("yolox-nano zcu104 2 cores", "yolox-nano", YOLOX_B4096, "zcu104", "fps", 463.41, 2, "validation",
            ZOO30 + ", ZCU104 multi thread 463.41 fps",
            "two cores share the DDR (active_cores = 2); fps = cores / per-frame DPU time, if neither the ARM nor "
            "the runner limits it. " + _YOLOX_SAME),
    VaicRow("yolox-nano zcu102 3 cores", "yolox-nano", YOLOX_B4096, "zcu102", "fps", 539.49, 3, "validation",
            ZOO30 + ", ZCU102 multi thread 539.49 fps",
            "three cores at 281 MHz share the DDR (active_cores = 3); as the ZCU104 row. " + _YOLOX_SAME),
    VaicRow("yolox-nano kv260 e2e", "yolox-nano", YOLOX_B4096, "kv260", "e2e_ms", 1000 / 198.11, 1, "bound",
            ZOO30 + ", KV260 single thread 198.11 fps",
            "end to end: image resize, the runner's I/O, YOLOX decode and NMS on the ARM, plus the DPU"),
    VaicRow("yolox-nano zcu104 e2e", "yolox-nano", YOLOX_B4096, "zcu104", "e2e_ms", 1000 / 193.20, 1, "bound",
            ZOO30 + ", ZCU104 single thread 193.20 fps", "end to end, as the KV260 single-thread row"),
    VaicRow("yolox-nano zcu102 e2e", "yolox-nano", YOLOX_B4096, "zcu102", "e2e_ms", 1000 / 186.09, 1, "bound",
            ZOO30 + ", ZCU102 single thread 186.09 fps", "end to end, as the KV260 single-thread row"),
    VaicRow("pointpillars kv260 1 core", "pointpillars", POINTPILLARS_VAI25, "kv260", "e2e_ms", 1000 / 32.24, 1,
            "bound", ZOO25.format(board="Kria KV260 SOM") + ", multi thread 32.24 fps",
            "the frame also needs voxelisation, the pillar scatter and box decoding/NMS on the ARM, which may be "
            "the bottleneck even with several threads; the xmodel is Vitis AI 2.5's custom-op example (same "
            "network, 12000x100x4 input, scatter as the PPScatterV2 CPU op), not the zoo's two xmodels"),
    VaicRow("pointpillars zcu102 e2e", "pointpillars", POINTPILLARS_VAI25, "zcu102", "e2e_ms", 1000 / 19.63, 1,
            "bound", ZOO25.format(board="ZCU102 (0432055-05)") + ", single thread 19.63 fps",
            "end to end, as the KV260 row"),
    VaicRow("mnist kv260 python loop", "mnist (DPU-PYNQ)", MNIST_PYNQ, "kv260", "e2e_ms", 1000 / 2756.2394, 1,
            "bound", PYNQ_MNIST,
            "a Python loop per image (copy in, execute_async, wait, softmax): host-dominated; the board is not "
            "printed (the commit targets Kria)"),
)

#: A vai_c fit row counts as matched within this relative error (the band the fit's tie-break searches).
VAIC_BAND = 0.05


def xmodel_dirs() -> list[Path]:
    """Where the vai_c xmodels are looked up: $TVM_DPU_XMODELS, then the vendored tests/data/xmodel."""
    env = os.environ.get("TVM_DPU_XMODELS", "")
    return [Path(d) for d in env.split(os.pathsep) if d] + [VENDORED]


def find_xmodel(name: str) -> Path | None:
    for d in xmodel_dirs():
        p = d / name
        if p.is_file():
            return p
    return None


class VaicPrograms:
    """The DPU subgraphs of the rows' xmodels, decoded once, and their simulated time under given parameters."""

    def __init__(self) -> None:
        self._code: dict[str, list[tuple[int, np.ndarray]]] = {}
        self._ms: dict[tuple, float] = {}  # rows on one xmodel and board share their simulations

    def available(self, row: VaicRow) -> bool:
        return find_xmodel(row.xmodel) is not None

    def programs(self, row: VaicRow) -> list[tuple[int, np.ndarray]]:
        """(fingerprint, machine code) of every DPU subgraph of the row's xmodel."""
        if row.xmodel not in self._code:
            path = find_xmodel(row.xmodel)
            if path is None:
                raise FileNotFoundError(f"{row.xmodel} not found in {', '.join(map(str, xmodel_dirs()))}")
            self._code[row.xmodel] = [(d.fingerprint, np.frombuffer(d.mc_code, "<u4").astype(np.uint32))
                                      for d in read_xmodel(path).dpu_subgraphs()]
        return self._code[row.xmodel]

    def dpu_ms(self, row: VaicRow, params: TimingParams, active_cores: int = 1) -> float:
        """Simulated DPU time of one frame (all DPU subgraphs, one after another) in ms."""
        p = params.replace(active_cores=active_cores)
        key = (row.xmodel, row.board, tuple(sorted(vars(p).items())))
        if key not in self._ms:
            total = 0.0
            for fp, code in self.programs(row):
                arch = board_arch(fp, row.board)
                total += simulate(code, arch, p).cycles / (arch.freq_mhz * 1e3)
            self._ms[key] = total
        return self._ms[key]

    def predict(self, row: VaicRow, params: TimingParams) -> float:
        """The row's prediction in its metric's unit (ms, or fps on `row.cores` cores)."""
        if row.metric == "fps":
            return row.cores * 1e3 / self.dpu_ms(row, params, row.cores)
        return self.dpu_ms(row, params)


def board_arch(fingerprint: int, board: str) -> Arch:
    """The DPU `fingerprint` names, on `board`'s clock, core count and DDR bandwidth."""
    b = load_arch(board)
    return dataclasses.replace(arch_from_fingerprint(fingerprint), board=b.board, freq_mhz=b.freq_mhz,
                               cores=b.cores, ddr_bytes_per_s=b.ddr_bytes_per_s)


def relative_error(row: VaicRow, predicted: float) -> float:
    return (predicted - row.published) / row.published


def row_record(row: VaicRow, predicted: float, dpu_ms: float) -> dict:
    """The JSON record of a row at one parameter set: prediction, error, and for a bound the implied ARM time."""
    rec = {"key": row.key, "network": row.network, "xmodel": row.xmodel, "board": row.board, "metric": row.metric,
           "published": row.published, "cores": row.cores, "use": row.use, "source": row.source, "why": row.why,
           "predicted": predicted, "dpu_ms": dpu_ms, "relative_error": relative_error(row, predicted)}
    if row.use == "bound":
        rec["within_bound"] = predicted <= row.published
        rec["implied_host_ms"] = row.published - predicted
    return rec


__all__ = ["VAIC_ROWS", "VAIC_BAND", "VaicRow", "VaicPrograms", "board_arch", "find_xmodel", "relative_error",
           "row_record", "xmodel_dirs"]
