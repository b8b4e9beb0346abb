"""Check an .xmodel against every read AMD's VART (2.5 - 3.5) makes of a DPU subgraph before it runs it.

Each rule below restates a check of VART's open source (Xilinx/Vitis-AI, src/vai_runtime/vart: dpu-runner,
runner-assistant, util, runner), read as the specification of what `vart::Runner::create_runner(subgraph, "run")`
and the runner's first execute need; the source function is named in every finding. Without a board, VART stops
at opening the XRT device before any of these reads (docs/deploy.md), so this checker is what says whether a file
would get past them:

- `Runner::create_runner` (runner/src/dpu_runner.cpp): a `runner` map naming a library for the mode.
- `DpuKernel` (dpu_kernel.cpp): `mc_code` (release mode), `reg_id_to_context_type` and `reg_id_to_size`, a size for
  every DATA region and a DATA total > 0 (`create_workspaces`), parameter bytes for every CONST region
  (`my_load_parameter`); in debug mode `children_topological_sort` naming children (`my_load_debug_code`).
- `DpuSessionBaseImp::initialize` (dpu_session_base_imp.cpp): `init_tensors` on every op output of the subgraph and
  on its input tensors, each through `get_op_output_tensor_ddr`: a download takes its one input's placement; a
  tensor without `reg_id` (or produced outside the subgraph) must feed exactly one op of the subgraph and that op
  must be an `upload` ("illegal xmodel. op:... has no ddr info"); the placement needs `reg_id`, `ddr_addr` and
  `location` (int32). Input and output tensors need plain (contiguous) strides (`is_normal_stride`).
- `extract_reg_info_from_subgraph` (util/src/zero_copy_helper.cpp) and `collect_reg_info` /
  `extract_reg_info_from_subgraph_and_attrs` (runner-assistant/src/tensor_buffer_allocator_imp.cpp): regions from
  `reg_id_to_context_type_v2` (else v1), named REG_<n> with n < 256, each with a size > 0 and CONST ones with
  parameter bytes; an INTERFACE region must hold an input or an output; a tensor in DDR (location 1) names one of
  those regions and lies within it (VART only logs "ddr execeed?"; the DPU would write past the buffer).
- `DpuRunnerDdr::fill_gen_reg` (imp/dpu_runner_ddr.cpp): input and output tensors have location 1.
- `DpuRunnerBaseImp::check_fingerprint` (dpu_runner_base_imp.cpp): `dpu_fingerprint` (uint64) equal to the DPU's.
- `xir::Attrs::get_attr<T>`: every attribute above has the type VART asks for (an any_cast fails otherwise).

Two rules are the project's own consistency checks beside VART's reads: region maps v1 and v2 agree, and a
const-fix op's `data` bytes (where set: vai_c leaves them empty) are found at its place in the CONST region VART
uploads.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from ..codegen.isa import iter_program
from ..errors import ArchError, ISAError
from .model import XModel, XOp, XSubgraph, XTensor, instruction_set_of, split_extent, weight_split

#: Largest region number + 1 (util/include/vart/zero_copy_helper.hpp MAX_REG_ID_SIZE).
MAX_REG_ID = 256

#: rule -> (VART source it comes from, what it requires).
RULES: dict[str, tuple[str, str]] = {
    "runner-attr": ("vart::Runner::create_runner (runner/src/dpu_runner.cpp)",
                    "a DPU or CPU subgraph carries a `runner` string map with a library for mode 'run'"),
    "attr-type": ("xir::Attrs::get_attr<T> (any_cast), as called by VART",
                  "attributes VART reads have the type it reads them as"),
    "mc-code": ("DpuKernel::my_load_release_code (dpu-runner/src/dpu_kernel.cpp)",
                "`mc_code` present, whole 32-bit words, decoding as ISA1"),
    "reg-maps": ("DpuKernel::create_workspaces / my_load_parameter (dpu_kernel.cpp)",
                 "`reg_id_to_context_type` and `reg_id_to_size` present; every DATA region sized; DATA total > 0"),
    "reg-name": ("get_reg_index (util/src/zero_copy_helper.cpp)", "regions are named REG_<n>, n < 256"),
    "reg-size": ("extract_reg_info_from_subgraph_and_attrs (runner-assistant/src/tensor_buffer_allocator_imp.cpp)",
                 "every region of the context-type map has a size > 0"),
    "reg-type": ("extract_reg_info_from_subgraph (util/src/zero_copy_helper.cpp)",
                 "v2 types are CONST/WORKSPACE/DATA/INTERFACE (v1 CONST/DATA); an INTERFACE region holds an input "
                 "or an output tensor"),
    "reg-maps-agree": ("tvm-dpu (DpuKernel reads v1, the allocator v2)",
                       "reg_id_to_context_type and _v2 name the same regions, CONST in one iff CONST in the other"),
    "const-params": ("DpuKernel::my_load_parameter (dpu_kernel.cpp); extract_reg_info_from_subgraph_and_attrs",
                     "every CONST region has `reg_id_to_parameter_value` bytes, no more than its size"),
    "const-bytes": ("tvm-dpu (the CONST region is what VART uploads)",
                    "a const-fix op's `data` values are in the CONST region from its ddr_addr to the next constant"),
    "fingerprint": ("DpuRunnerBaseImp::check_fingerprint (dpu-runner/src/dpu_runner_base_imp.cpp)",
                    "`dpu_fingerprint` is a known DPU's (0 turns the check off)"),
    "ddr-info": ("get_op_output_tensor_ddr via DpuSessionBaseImp::init_tensors (dpu_session_base_imp.cpp)",
                 "every op output (and input tensor) resolves to a tensor with reg_id, ddr_addr and location: "
                 "its own, a download's input's, or the one upload it feeds"),
    "tensor-region": ("collect_reg_info (runner-assistant/src/tensor_buffer_allocator_imp.cpp)",
                      "a tensor with location 1 is in a region of the subgraph, [ddr_addr, ddr_addr + size) "
                      "inside it (a DPUCAHX8H weight in HBM segment W0: half of each OCP output channels there, "
                      "the others at the same offsets in W1); location is 0 (on chip) or 1 (DDR)"),
    "fix-point": ("operator<<(my_tensor_t) / vart::get_input_scale (runner helpers)",
                  "every tensor of the DPU subgraph has an int32 `fix_point`"),
    "io-stride": ("is_normal_stride in DpuSessionBaseImp::init_tensors (check_stride for inputs/outputs)",
                  "input and output tensors have plain NHWC strides (or none), one per dimension"),
    "io-location": ("DpuRunnerDdr::fill_gen_reg / get_ddr_addr (dpu-runner/src/imp/dpu_runner_ddr.cpp)",
                    "the subgraph has inputs and outputs, each in DDR (location 1), not in a CONST region"),
    "debug-order": ("DpuKernel::my_load_debug_code (dpu_kernel.cpp)",
                    "`children_topological_sort` names children of the subgraph (debug mode runs them in order)"),
}

#: Attributes VART reads and the XIR attribute kind it reads them as.
SUBGRAPH_KINDS = {"mc_code": "bytes_value", "dpu_fingerprint": "uint64_value",
                  "reg_id_to_size": "map_string_2_int32_value",
                  "reg_id_to_context_type": "map_string_2_string_value",
                  "reg_id_to_context_type_v2": "map_string_2_string_value",
                  "reg_id_to_parameter_value": "map_string_2_bytes_value",
                  "children_topological_sort": "string_vec_value", "workload": "uint64_value",
                  "workload_on_arch": "uint64_value", "runner": "map_string_2_string_value",
                  "dpu_name": "string_value"}
TENSOR_KINDS = {"reg_id": "int32_value", "ddr_addr": "int32_value", "location": "int32_value",
                "fix_point": "int32_value", "stride": "int32_vec_value"}
V1_TYPES, V2_TYPES = ("CONST", "DATA"), ("CONST", "WORKSPACE", "DATA", "INTERFACE")


@dataclass(frozen=True)
class Finding:
    """One broken rule: `where` names the subgraph and the op / tensor / attribute."""
    rule: str
    where: str
    message: str
    severity: str = "error"  # "error": VART aborts or the DPU misbehaves; "warning": a VART mode or check is lost

    @property
    def source(self) -> str:
        return RULES[self.rule][0]

    def __str__(self) -> str:
        return f"{self.severity}: [{self.rule}] {self.where}: {self.message} (VART: {self.source})"

    def to_dict(self) -> dict[str, str]:
        return {**asdict(self), "source": self.source}


def _kind_findings(attrs: dict[str, Any], kinds: dict[str, str], table: dict[str, str],
                   where: str) -> list[Finding]:
    return [Finding("attr-type", where, f"attribute {k!r} is a {kinds.get(k)}, VART reads a {want}")
            for k, want in table.items() if k in attrs and kinds.get(k) != want]


class _Subgraph:
    """What VART sees of one DPU subgraph: its ops, input and output tensors, regions."""

    def __init__(self, model: XModel, sg: XSubgraph):
        self.model, self.sg = model, sg
        self.where = f"DPU subgraph {sg.name!r}"
        self.op_names = set(sg.all_ops())
        self.ops = [model.op(n) for n in sg.all_ops()]
        self.fanout: dict[str, list[XOp]] = {}
        for op in model.ops:
            for src in op.input_ops:
                self.fanout.setdefault(src, []).append(op)
        self.findings: list[Finding] = []
        self.placed: dict[str, XTensor | None] = {}

    def add(self, rule: str, where: str, message: str, severity: str = "error") -> None:
        self.findings.append(Finding(rule, f"{self.where}, {where}" if where else self.where, message, severity))

    # -- XIR's Subgraph::get_input_tensors / get_output_tensors
    def input_producers(self) -> list[XOp]:
        """Ops outside the subgraph whose output an op inside reads (XIR's input tensors), in graph order."""
        names = {n for op in self.ops for n in op.input_ops if n not in self.op_names}
        return [op for op in self.model.ops if op.name in names]

    def output_producers(self) -> list[XOp]:
        """Ops inside whose output is read outside or by no op (XIR's output tensors)."""
        return [op for op in self.ops
                if not self.fanout.get(op.name) or any(c.name not in self.op_names for c in self.fanout[op.name])]

    def ddr_tensor(self, op: XOp) -> XTensor | None:
        """get_op_output_tensor_ddr: the tensor whose reg_id/ddr_addr/location VART takes for `op`'s output, or
        None after recording why there is none (once per op: VART resolves outputs for every op and again for
        the subgraph's outputs)."""
        if op.name not in self.placed:
            self.placed[op.name] = self._ddr_tensor(op)
        return self.placed[op.name]

    def _ddr_tensor(self, op: XOp) -> XTensor | None:
        tensor = op.output
        inside = op.name in self.op_names
        if op.type == "download" and inside:
            srcs = op.inputs.get("input", [])
            if len(srcs) != 1:
                self.add("ddr-info", f"download op {op.name!r}", f"{len(srcs)} input ops; VART needs exactly one")
                return None
            tensor = self.model.op(srcs[0]).output
        elif "reg_id" not in tensor.attrs or not inside:
            users = [c for c in self.fanout.get(op.name, []) if c.name in self.op_names]
            if len(users) != 1 or users[0].type != "upload":
                fed = ", ".join(f"{c.name} ({c.type})" for c in users) or "no op of the subgraph"
                self.add("ddr-info", f"op {op.name!r}", f"illegal xmodel. op:{op.name} has no ddr info: its tensor "
                         f"{tensor.name!r} has no reg_id and it feeds {fed}, not exactly one upload op")
                return None
            tensor = users[0].output
        missing = [k for k in ("reg_id", "ddr_addr", "location") if k not in tensor.attrs]
        if missing:
            self.add("ddr-info", f"op {op.name!r}", f"tensor {tensor.name!r} has no {', '.join(missing)}")
            return None
        bad = _kind_findings(tensor.attrs, tensor.attr_kinds, TENSOR_KINDS, f"tensor {tensor.name!r}")
        if bad:
            self.findings += [Finding(f.rule, f"{self.where}, {f.where}", f.message) for f in bad]
            return None
        return tensor

    # -- the rules
    def check(self) -> list[Finding]:
        a, kinds = self.sg.attrs, self.sg.attr_kinds
        self.findings += [Finding(f.rule, self.where, f.message) for f in
                          _kind_findings(a, kinds, SUBGRAPH_KINDS, "")]
        self.check_runner()
        self.check_code()
        regions = self.check_regions()
        self.check_fingerprint()
        self.check_debug_order()
        self.check_tensors(regions)
        return self.findings

    def check_runner(self) -> None:
        runner = self.sg.attrs.get("runner")
        if not isinstance(runner, dict) or not runner.get("run"):
            self.add("runner-attr", "", f"no `runner` map with a 'run' library (has {runner!r}): "
                     "\"Cannot find runner attr, this subgraph may not be compiled!\"")

    def check_code(self) -> None:
        code = self.sg.attrs.get("mc_code")
        if not isinstance(code, bytes) or not code:
            self.add("mc-code", "", "no `mc_code` bytes: VART's release mode has no program to load")
            return
        if len(code) % 4:
            self.add("mc-code", "", f"`mc_code` is {len(code)} bytes, not whole 32-bit instruction words")
            return
        isa = instruction_set_of(self.sg.attrs.get("dpu_fingerprint"))
        try:
            for _ in iter_program(np.frombuffer(code, "<u4"), isa=isa):
                pass
        except ISAError as e:
            self.add("mc-code", "", f"`mc_code` does not decode as {isa}: {e}")

    def check_regions(self) -> dict[int, tuple[str, int]]:
        """The regions VART's allocator builds, {n: (type, size)}; findings for every map rule broken."""
        a = self.sg.attrs
        v1 = a.get("reg_id_to_context_type")
        v2 = a.get("reg_id_to_context_type_v2")
        sizes = a.get("reg_id_to_size")
        params = a.get("reg_id_to_parameter_value") if isinstance(a.get("reg_id_to_parameter_value"), dict) else {}
        if not isinstance(v1, dict) or not isinstance(sizes, dict):
            self.add("reg-maps", "", "no `reg_id_to_context_type` / `reg_id_to_size` maps: DpuKernel aborts")
            return {}
        data_total = 0
        for name, kind in v1.items():
            if kind not in V1_TYPES:
                self.add("reg-type", f"region {name}", f"reg_id_to_context_type {kind!r}, not one of {V1_TYPES}")
            if kind == "DATA":
                if name not in sizes:
                    self.add("reg-maps", f"region {name}", "a DATA region without a size")
                else:
                    data_total += int(sizes[name])
        if data_total <= 0:
            self.add("reg-maps", "", "no DATA region with a size > 0: \"total > 0\" fails in create_workspaces")
        if isinstance(v2, dict):
            if set(v1) != set(v2) or any((v1[k] == "CONST") != (v2[k] == "CONST") for k in v1 if k in v2):
                self.add("reg-maps-agree", "", f"v1 {dict(sorted(v1.items()))} and v2 {dict(sorted(v2.items()))} "
                         "disagree")
            for name, kind in v2.items():
                if kind not in V2_TYPES:
                    self.add("reg-type", f"region {name}", f"reg_id_to_context_type_v2 {kind!r}, not one of "
                             f"{V2_TYPES}")
        types = v2 if isinstance(v2, dict) else v1
        regions: dict[int, tuple[str, int]] = {}
        for name, kind in types.items():
            digits = name[4:] if name.startswith("REG_") else ""
            if not digits.isdigit() or int(digits) >= MAX_REG_ID:
                self.add("reg-name", f"region {name!r}", f"not REG_<n> with n < {MAX_REG_ID}")
                continue
            size = sizes.get(name, 0)
            if not isinstance(size, int) or size <= 0:
                self.add("reg-size", f"region {name}", f"size {size!r}: every region needs a size > 0")
            regions[int(digits)] = (kind, size if isinstance(size, int) else 0)
        for name in {k for k, v in v1.items() if v == "CONST"} | {k for k, v in types.items() if v == "CONST"}:
            data = params.get(name)
            if data is None:
                self.add("const-params", f"region {name}", "a CONST region without reg_id_to_parameter_value bytes")
            elif isinstance(sizes.get(name), int) and len(data) > sizes[name]:
                self.add("const-params", f"region {name}", f"{len(data)} parameter bytes in a {sizes[name]}-byte "
                         "region")
        return regions

    def check_fingerprint(self) -> None:
        from ..arch import load_arch

        fp = self.sg.attrs.get("dpu_fingerprint")
        if not isinstance(fp, int) or isinstance(fp, bool):
            self.add("fingerprint", "", "no `dpu_fingerprint`: VART skips the fingerprint check (model value 0)",
                     "warning")
            return
        if fp == 0:
            self.add("fingerprint", "", "`dpu_fingerprint` 0 turns VART's check off", "warning")
            return
        try:
            load_arch(fp)
        except ArchError:
            self.add("fingerprint", "", f"`dpu_fingerprint` {fp:#018x} is no known DPUCZDX8G configuration: "
                     "\"CHECK fingerprint fail!\" on every board")
            return

    def check_debug_order(self) -> None:
        order = self.sg.attrs.get("children_topological_sort")
        if order is None:
            self.add("debug-order", "", "no `children_topological_sort`: VART's debug mode "
                     "(XLNX_ENABLE_DEBUG_MODE=1) refuses the subgraph", "warning")
            return
        known = {c.name for c in self.sg.children} | {g.name for c in self.sg.children for g in c.children}
        unknown = [n for n in order if n not in known]
        if unknown:
            self.add("debug-order", "", f"`children_topological_sort` names {unknown[:3]}, not children of the "
                     "subgraph")

    def check_tensors(self, regions: dict[int, tuple[str, int]]) -> None:
        params = self.sg.attrs.get("reg_id_to_parameter_value")
        params = params if isinstance(params, dict) else {}
        consts: list[tuple[XOp, XTensor]] = []
        # DPUCAHX8H's HBM weights: a const in W0 holds half of each OCP output channels, the rest is in W1
        split = weight_split(self.sg.attrs, self.sg.attrs.get("dpu_fingerprint"))
        for op in self.ops:  # init_tensors(get_all_tensor_names): every op output of the subgraph
            t = self.ddr_tensor(op)
            if t is None:
                continue
            if "fix_point" not in op.output.attrs and op.output.dtype.startswith("x"):
                self.add("fix-point", f"tensor {op.output.name!r}", "no fix_point")
            if t.location not in (0, 1):
                self.add("tensor-region", f"tensor {t.name!r}", f"location {t.location}: 0 (on chip) or 1 (DDR)")
            if t.location != 1:
                continue
            if t.reg_id not in regions:
                self.add("tensor-region", f"tensor {t.name!r}", f"reg_id {t.reg_id} is no region of the subgraph "
                         f"(regions {sorted(regions)}): \"cannot find reg_info\"")
                continue
            kind, size = regions[t.reg_id]
            extent = split_extent(split, t) if op.type == "const-fix" else None
            end = t.ddr_addr + (t.nbytes if extent is None else extent)
            if t.ddr_addr < 0 or end > size:
                self.add("tensor-region", f"tensor {t.name!r}", f"bytes [{t.ddr_addr}, {end}) outside REG_{t.reg_id} "
                         f"({kind}, {size} bytes)")
            if extent is not None and end > regions.get(split[1], ("", 0))[1]:
                self.add("tensor-region", f"tensor {t.name!r}", f"its output channels split to REG_{split[1]} (W1) "
                         f"need bytes [{t.ddr_addr}, {end}) there, which REG_{split[1]} "
                         f"({regions.get(split[1], ('', 0))[1]} bytes) does not hold")
            elif kind == "CONST" and op.type == "const-fix" and op.attrs.get("data"):
                consts.append((op, t))
        self.check_const_bytes(consts, regions, params)
        self.check_io(regions)

    def check_const_bytes(self, consts: list[tuple[XOp, XTensor]], regions: dict[int, tuple[str, int]],
                          params: dict[str, bytes]) -> None:
        """vai_c leaves const-fix `data` empty; where it is set, the region holds its values in the DPU's own
        order and padding (weights by output-channel group, channels padded to the engine's parallelism) in the
        span up to the next constant, which may also hold packed bytes no const-fix op names (a second packing of
        the same weights for another pass): every nonzero byte of `data` must be found there (multisets)."""
        starts = sorted({(t.reg_id, t.ddr_addr) for _, t in consts})
        for op, t in consts:
            data = op.attrs["data"]
            later = [a for r, a in starts if r == t.reg_id and a > t.ddr_addr]
            span = params.get(f"REG_{t.reg_id}", b"")[t.ddr_addr:min(later, default=regions[t.reg_id][1])]
            if (not isinstance(data, bytes) or len(data) != t.nbytes
                    or Counter(data.replace(b"\0", b"")) - Counter(span.replace(b"\0", b""))):
                self.add("const-bytes", f"const-fix op {op.name!r}", f"its {len(data)} data bytes are not all among "
                         f"the values of REG_{t.reg_id} from {t.ddr_addr} to the next constant ({len(span)} bytes)")

    def check_io(self, regions: dict[int, tuple[str, int]]) -> None:
        ins = [(op, self.ddr_tensor(op)) for op in self.input_producers()]
        outs = [(op, self.ddr_tensor(op)) for op in self.output_producers()]
        for kind, side in (("input", ins), ("output", outs)):
            if not side:
                self.add("io-location", "", f"no {kind} tensor: \"input tensor is empty!\"")
            for op, t in side:
                xt = op.output  # the tensor VART's runner hands the user, with the placement of `t`
                if xt.strides is not None and (len(xt.strides) != len(xt.shape) or
                                               list(xt.strides) != _plain_strides(xt.shape)):
                    self.add("io-stride", f"{kind} tensor {xt.name!r}", f"stride {list(xt.strides)} for shape "
                             f"{list(xt.shape)}: VART needs {_plain_strides(xt.shape)}")
                if t is None:
                    continue
                if t.location != 1:
                    self.add("io-location", f"{kind} tensor {xt.name!r}", f"location {t.location}: VART hands "
                             "inputs and outputs over in DDR (location 1)")
                elif regions.get(t.reg_id, ("",))[0] == "CONST":
                    self.add("io-location", f"{kind} tensor {xt.name!r}", f"in CONST region REG_{t.reg_id}")
        for n, (kind, _) in regions.items():
            if kind == "INTERFACE" and not any(t is not None and t.reg_id == n for _, t in ins + outs):
                self.add("reg-type", f"region REG_{n}", "an INTERFACE region that holds no input or output tensor")


def _plain_strides(shape: tuple[int, ...]) -> list[int]:
    out, step = [], 1
    for d in reversed(shape):
        out.append(step)
        step *= d
    return out[::-1]


def check_vart(model: XModel) -> list[Finding]:
    """Every rule of the module docstring on every DPU subgraph of `model` (and `runner` on CPU subgraphs)."""
    findings: list[Finding] = []
    for sg in model.root.children:
        if sg.device == "CPU" and not isinstance(sg.attrs.get("runner"), dict):
            findings.append(Finding("runner-attr", f"CPU subgraph {sg.name!r}", "no `runner` map: VART's graph "
                                    "runner cannot create the CPU runner"))
        if sg.device == "DPU":
            findings += _Subgraph(model, sg).check()
    return findings


def format_findings(model: XModel, findings: list[Finding]) -> str:
    """What `tvm-dpu inspect --check-vart` prints."""
    n_dpu = len(model.subgraphs("DPU"))
    errors = sum(f.severity == "error" for f in findings)
    head = (f"{model.source}: {n_dpu} DPU subgraph(s) checked against VART's reads ({len(RULES)} rules): "
            f"{errors} error(s), {len(findings) - errors} warning(s)")
    return "\n".join([head] + [f"  {f}" for f in findings]) + "\n"


def xir_io_tensors(model: XModel, sg: XSubgraph) -> tuple[list[str], list[str]]:
    """The names of `sg`'s input and output tensors as XIR's Subgraph::get_input_tensors / get_output_tensors give
    them (what VART's session hands the user), in graph order."""
    view = _Subgraph(model, sg)
    return [op.output.name for op in view.input_producers()], [op.output.name for op in view.output_producers()]
