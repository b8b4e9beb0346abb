"""Host cost model: what the CPU beside the DPU spends per frame, as data measured by benchmarks/bench_host.py.

The DPU timing model predicts the accelerator; a user also pays the host around it. Per call of a deployed model
(one pipeline stage, one virtual-DPU segment) the host:

* enters the Relax VM (`call_s`: the VM call and the Python around it, per model run);
* drives the DPU once per DPU program (`dpu_call_s`: the device call without its DPU work - the "driver"); a
  program's weights and code stay resident on the device once it is loaded (runtime/device.py), so they cost
  `region_s_per_byte` x its weight bytes once, at its first call (`upload_seconds`), not every frame;
* converts feature maps between float and the DPU's int8 at the DPU boundary and on a pipeline's wire
  (`quant_s_per_elem` float32 -> int8, `dequant_s_per_elem` int8 -> float32);
* moves int8 feature maps into and out of the DPU's DDR regions in its layout (`dma_s_per_byte`: the input
  DMA and the output read-back; on a board a cache flush / invalidate plus the DPU's own AXI reads, here the
  layout copy the emulator's device does);
* hands float tensors into and out of the Relax VM (`vm_s_per_elem`, each way);
* runs the CPU ops TVM compiled for the parts the DPU does not take (`cpu_fixed_s + cpu_s_per_elem x output
  elements + cpu_s_per_mac x multiply-accumulates` per op: a least-squares fit over TVM-compiled elementwise,
  reduction and softmax ops, then conv2d and matmul beyond it);
* in a pipeline stage that passes int8 through (no Relax VM, `int8_call_seconds`) pays `int8_call_s` for the call
  instead of `call_s` and no float conversion between DPU stages;
* per virtual-DPU segment, starts its program and waits for its core (`segment_s`: a thread, dependency events,
  the driver round trip); the segments hand feature maps over in the device's shared DDR region, so no copy.

The figures are measured on one host (`host_cost.json` records which, when and how) and scale with `scale`
(e.g. a board's ARM cores against the measuring host), which is 1.0 unless a caller knows better: nothing here
guesses an ARM figure.
"""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from tvm_dpu.timing.params import TimingError

DATA_FILE = "host_cost.json"


@dataclass(frozen=True)
class HostCost:
    """Per-call host seconds (see module docstring); `source` says where the figures come from."""

    call_s: float
    dpu_call_s: float
    quant_s_per_elem: float
    dequant_s_per_elem: float
    dma_s_per_byte: float
    vm_s_per_elem: float
    cpu_fixed_s: float
    cpu_s_per_elem: float
    segment_s: float
    region_s_per_byte: float = 0.0
    #: CPU ops' cost per multiply-accumulate beyond the per-element one (TVM-compiled conv2d / matmul)
    cpu_s_per_mac: float = 0.0
    #: The runtime's own cost of one call that passes int8 through (no Relax VM; `int8_call_seconds`)
    int8_call_s: float = 0.0
    source: str = ""
    scale: float = 1.0

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if f.name != "source" and not (isinstance(v, (int, float)) and v >= 0.0):
                raise TimingError(f"host cost {f.name} = {v!r}: must be a number >= 0")

    def scaled(self, factor: float) -> "HostCost":
        """The same costs on a host `factor` times slower (factor > 1) or faster."""
        if factor <= 0:
            raise TimingError(f"host cost scale {factor}: must be positive")
        return dataclasses.replace(self, scale=self.scale * factor)

    def conversion_s(self, elems: int) -> float:
        """Host seconds for `elems` feature-map elements that enter or leave one call: on arrival the wire's
        dequantize, the VM's copy, the runner's quantize and the DMA in; on leaving the DMA out, dequantize, the
        VM's copy and the wire's quantize (one of each pair per direction)."""
        return self.scale * elems * (self.quant_s_per_elem + self.dequant_s_per_elem + self.dma_s_per_byte
                                     + self.vm_s_per_elem)

    def cpu_ops_s(self, op_elems: list[int] | tuple[int, ...], op_macs: list[int] | tuple[int, ...] = ()) -> float:
        """CPU ops run by the Relax VM, each given by its output elements and (conv2d, matmul) its
        multiply-accumulates (`op_macs`, parallel to `op_elems`; absent: none)."""
        macs = list(op_macs) + [0] * (len(op_elems) - len(op_macs))
        return self.scale * sum(self.cpu_fixed_s + self.cpu_s_per_elem * e + self.cpu_s_per_mac * m
                                for e, m in zip(op_elems, macs))

    def call_seconds(self, in_elems: int, out_elems: int, dpu_calls: int = 1, cpu_op_elems: tuple = (),
                     region_bytes: int = 0) -> float:
        """Host seconds of one model call (a pipeline stage's frame): VM, driver per DPU program, conversions and
        DMA of what enters and leaves, CPU ops; `region_bytes`: weight bytes written to the device during this
        call, 0 once the model is loaded (its first call adds `upload_seconds` of its weights)."""
        return (self.scale * (self.call_s + dpu_calls * self.dpu_call_s) + self.upload_seconds(region_bytes)
                + self.conversion_s(in_elems + out_elems) + self.cpu_ops_s(cpu_op_elems))

    def upload_seconds(self, weight_bytes: int) -> float:
        """Host seconds of writing `weight_bytes` of weights into device regions: once per loaded model."""
        return self.scale * self.region_s_per_byte * weight_bytes

    def segment_seconds(self) -> float:
        """Host seconds one virtual-DPU segment adds: starting its program on its core and waiting for it (thread,
        dependency events, driver round trip). Its weights are resident and its inputs already lie in the shared
        region where their producers saved them: no copy."""
        return self.scale * self.segment_s

    def int8_call_seconds(self, in_bytes: int, out_bytes: int, quant_elems: int = 0, dequant_elems: int = 0,
                          dpu_calls: int = 1, region_bytes: int = 0) -> float:
        """Host seconds of one call that passes int8 through, as a board's runtime does between DPU stages (no
        Relax VM floats): the runtime call, the driver, the DMA of the int8 bytes in and out, and only where the call starts from floats (`quant_elems`, a pipeline's first stage) or must end in them
        (`dequant_elems`, its last) the conversion; `region_bytes` as in `call_seconds`."""
        return self.upload_seconds(region_bytes) + self.scale * (
            self.int8_call_s + dpu_calls * self.dpu_call_s + self.dma_s_per_byte * (in_bytes + out_bytes)
            + self.quant_s_per_elem * quant_elems + self.dequant_s_per_elem * dequant_elems)

    def to_json(self) -> dict:
        return dataclasses.asdict(self)


def _path() -> Any:
    return resources.files("tvm_dpu.timing").joinpath(DATA_FILE)


def load_host_cost(path: str | Path | None = None) -> HostCost:
    """The measured host cost model (`host_cost.json` beside this module, or `path`)."""
    try:
        text = Path(path).read_text() if path is not None else _path().read_text()
        doc = json.loads(text)
        fields = {f.name for f in dataclasses.fields(HostCost)} - {"source", "scale"}
        # terms added later have defaults (0: not measured in that file); the first ones are required
        required = {f.name for f in dataclasses.fields(HostCost) if f.default is dataclasses.MISSING}
        missing = sorted(required - set(doc.get("cost", {})))
        if missing:
            raise TimingError(f"{path or DATA_FILE}: host cost lacks {missing}")
        unknown = sorted(set(doc["cost"]) - fields)
        if unknown:
            raise TimingError(f"{path or DATA_FILE}: unknown host cost terms {unknown}")
        return HostCost(**{k: float(v) for k, v in doc["cost"].items()}, source=str(doc.get("source", "")))
    except (OSError, ValueError, TypeError) as e:
        raise TimingError(f"{path or DATA_FILE}: not a host cost file ({e})") from None
