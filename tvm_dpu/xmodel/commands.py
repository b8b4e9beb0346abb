"""`tvm-dpu inspect|run|report m.xmodel`: the CLI's commands on an .xmodel, vai_c's or one tvm-dpu wrote (cli.py
dispatches here on the suffix)."""
from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

from ..codegen.isa import iter_program
from ..errors import DPUError, ISAError, XModelError
from .model import DpuSubgraph, XModel, XOp, XSubgraph, read_xmodel



def instr_counts(sub: DpuSubgraph) -> Counter:
    """Instructions of the subgraph's machine code, per name (XModelError if it does not decode)."""
    isa = sub.instruction_set
    try:
        return Counter(ins.name for _, ins in iter_program(np.frombuffer(sub.mc_code, "<u4"), isa=isa))
    except ISAError as e:
        raise XModelError(f"DPU subgraph {sub.name!r}: mc_code does not decode as {isa}: {e}") from None


def compiled_by(model: XModel) -> str:
    """Who wrote the file: "tvm-dpu" (our writer marks its graphs with origin tvm-dpu and a tvm-dpu libs_info
    entry), "vai_c" (xcompiler's libs_info, as every vai_c file carries) or "an unknown compiler"."""
    libs = model.attrs.get("libs_info")
    keys = list(libs) if isinstance(libs, dict) else []
    if model.attrs.get("origin") == "tvm-dpu" or any(k.startswith("tvm-dpu") for k in keys):
        return "tvm-dpu"
    if any(k.startswith("xcompiler") for k in keys):
        return "vai_c"
    return "an unknown compiler"


def _compiler(model: XModel) -> str:
    """The compiler versions the file's libs_info names, or why there are none."""
    libs = model.attrs.get("libs_info")
    if isinstance(libs, dict):
        names = sorted({k.split(" : ")[0] for k in libs if k.startswith(("xcompiler", "tvm-dpu"))})
        if names:
            return ", ".join(names)
    return "no libs_info"


def _op_line(op: XOp) -> str:
    t = op.output
    fp = "" if t.fix_point is None else f" fix_point {t.fix_point}"
    place = "" if t.reg_id is None else f" REG_{t.reg_id}@{t.ddr_addr}"
    keys = ("kernel", "stride", "pad", "dilation", "type", "nonlinear", "axis", "order", "shape")
    attrs = " ".join(f"{k}={op.attrs[k]}" for k in keys if k in op.attrs and op.type not in ("const-fix",))
    args = "; ".join(f"{a}: {', '.join(v)}" for a, v in op.inputs.items())
    return (f"{op.type:18s} {op.name}  -> {list(t.shape)} {t.dtype}{fp}{place}" + (f"  [{attrs}]" if attrs else "")
            + (f"  <- {args}" if args else ""))


def _tree_lines(model: XModel, sg: XSubgraph, depth: int, dpu: dict[str, DpuSubgraph]) -> list[str]:
    pad = "  " * depth
    label = sg.device or ("root" if sg is model.root else "group")
    line = f"{pad}{sg.name} [{label}]"
    if sg.name in dpu and sg.device == "DPU":
        d = dpu[sg.name]
        counts = instr_counts(d)
        regions = ", ".join(f"{r.name} {r.context_type_v2 or r.context_type} {r.size} B"
                            for r in sorted(d.regions.values(), key=lambda r: r.reg_id))
        line += (f" {d.dpu_name} fingerprint {d.fingerprint:#018x}: {sum(counts.values())} instructions "
                 f"({', '.join(f'{k} {v}' for k, v in sorted(counts.items()))}); {regions}")
    elif sg.ops:
        line += f" ops: {', '.join(sg.ops)}"
    out = [line]
    for c in sg.children:
        out += _tree_lines(model, c, depth + 1, dpu)
    return out


def inspect_text(model: XModel, disasm: bool = False) -> str:
    """What `tvm-dpu inspect m.xmodel` prints: the graph, the subgraph tree, ops with fix points, each DPU
    subgraph's I/O placement and (with `disasm`) its instruction listing."""
    dpus = {d.name: d for d in model.dpu_subgraphs()}
    n_cpu = len(model.cpu_subgraphs())
    lines = [f"{model.source}: XIR graph {model.name!r} compiled by {compiled_by(model)} ({_compiler(model)}; "
             f"origin {model.attrs.get('origin', '?')}): {len(model.ops)} ops, {len(dpus)} DPU and {n_cpu} CPU "
             "subgraph(s)",
             "", "subgraph tree:"]
    lines += _tree_lines(model, model.root, 1, dpus)
    lines += ["", "ops:"] + [f"  {_op_line(op)}" for op in model.ops]
    for d in dpus.values():
        lines += ["", f"DPU subgraph {d.name}: code {len(d.mc_code)} B, preload {len(d.mc_code_preload)} B"]
        for kind, ts in (("input", d.inputs), ("output", d.outputs)):
            for t in ts:
                lines.append(f"  {kind:6s} {t.name}: shape {list(t.shape)}, fix_point {t.fix_point}, REG_{t.reg_id} "
                             f"ddr_addr {t.ddr_addr}, strides {list(t.strides or [])}")
        if disasm:
            from ..codegen.asm import disassemble

            lines.append(disassemble(np.frombuffer(d.mc_code, "<u4").astype(np.uint32),
                                     d.instruction_set).rstrip("\n"))
    return "\n".join(lines) + "\n"


def inspect_json(model: XModel) -> dict[str, Any]:
    def tree(sg: XSubgraph) -> dict:
        return {"name": sg.name, "device": sg.device, "ops": sg.ops, "children": [tree(c) for c in sg.children]}

    dpus = model.dpu_subgraphs()
    return {"file": model.source, "graph": model.name, "compiled_by": compiled_by(model), "compiler": _compiler(model),
            "origin": model.attrs.get("origin"), "tree": tree(model.root),
            "ops": [{"name": op.name, "type": op.type, "shape": list(op.output.shape), "dtype": op.output.dtype,
                     "fix_point": op.output.fix_point, "inputs": op.inputs} for op in model.ops],
            "dpu_subgraphs": [{"name": d.name, "dpu": d.dpu_name, "fingerprint": f"{d.fingerprint:#018x}",
                               "instructions": dict(instr_counts(d)), "code_bytes": len(d.mc_code),
                               "regions": {r.name: {"type": r.context_type, "size": r.size}
                                           for r in d.regions.values()}} for d in dpus]}


def check_deps(path: Any, races: bool = True) -> dict[str, dict[str, Any]]:
    """The dependency checker (tvm_dpu.timing.depcheck) on every DPU subgraph of a vai_c xmodel, races found from
    the emulator's access sets on the subgraph's own regions: {subgraph: {"program": DepReport}}."""
    from tvm_dpu.runtime.dep_check import check_code

    from .runner import load_xmodel

    runner = load_xmodel(path)
    return {name: {"program": check_code(p.sg.code, runner.arch, p.new_regions(), races)}
            for name, p in runner.programs.items()}


def check_xir(path: Any) -> Any:
    """AMD's XIR on the file (xir_judge.check_xmodel: load, shape inference on every op); DPUError with the one
    reason when XIR or a compiler to build the checker is missing here."""
    from .xir_judge import XirUnavailable, check_xmodel

    try:
        return check_xmodel(path)
    except XirUnavailable as e:
        raise DPUError(f"--check-xir: AMD's XIR cannot be run on this machine: {e}") from None


def xir_json(rep: Any) -> dict[str, Any]:
    return {"ok": rep.ok, "error": rep.error, "ops": len(rep.ops), "subgraphs": len(rep.subgraphs),
            "mismatches": [{"op": o.name, "type": o.type, "file": o.shape, "xir": o.inferred} for o in rep.mismatches]}


def run_checks(args: Any) -> int:
    """`inspect --check-xir` and/or `--check-vart`: AMD's XIR's verdict, then the VART checker's; exit 1 when
    XIR refuses the file or infers another shape, or a VART rule is broken."""
    doc: dict[str, Any] = {"file": str(args.artifact)}
    failed = False
    if args.check_xir:
        rep = check_xir(args.artifact)
        failed |= not rep.ok
        doc["xir"] = xir_json(rep)
        if not args.json:
            print(f"AMD's XIR: {rep.summary()}")
    if args.check_vart:
        from .vart_check import check_vart, format_findings

        model = read_xmodel(args.artifact)
        findings = check_vart(model)
        failed |= any(f.severity == "error" for f in findings)
        doc["file"] = model.source
        doc["findings"] = [f.to_dict() for f in findings]
        if not args.json:
            print(format_findings(model, findings), end="")
    if args.json:
        print(json.dumps(doc, indent=2))
    return 1 if failed else 0


def run_inspect(args: Any) -> int:
    if getattr(args, "check_vart", False) or getattr(args, "check_xir", False):
        return run_checks(args)
    if getattr(args, "check_deps", False):
        from tvm_dpu.runtime.dep_check import format_reports

        reports = check_deps(args.artifact)
        print(format_reports(reports))
        return 0 if all(r.ok for per in reports.values() for r in per.values()) else 2
    model = read_xmodel(args.artifact)
    if args.json:
        print(json.dumps(inspect_json(model), indent=2))
    else:
        print(inspect_text(model, args.disasm), end="")
    return 0


def run_run(args: Any, feeds_for: Any, print_outputs: Any, save_outputs: Any) -> int:
    """`tvm-dpu run m.xmodel`; `feeds_for` / `print_outputs` / `save_outputs` are the CLI's input reader, output
    printer and .npz writer."""
    from .runner import load_xmodel

    (path,) = args.compiled
    # --verify on anyone's file: the golden reference is rebuilt from the file's own quantized ops (compare's
    # rebuild), never from its machine code, so vai_c's programs are checked as ours are.
    who = compiled_by(read_xmodel(path)) if args.verify else ""
    for flag, bad in (("--cores", args.cores), ("--executor ray", args.executor != "local"),
                      ("--require-signature", args.require_signature)):
        if bad:
            raise XModelError(f"{flag} does not apply to an .xmodel (one program per DPU subgraph on one core, "
                              "and .xmodel files are not signed)")
    if len(args.input or []) > 1:
        raise XModelError(f"--input given {len(args.input)} times for one model")
    if args.device == "pynq":
        if not args.bitfile:
            raise XModelError("--device pynq needs --bitfile (the DPU bitstream, e.g. dpu.bit)")
        runner = load_xmodel(path, device="pynq", bitfile=args.bitfile, timeout_s=args.timeout)
    else:
        runner = load_xmodel(path)
    if args.verify:
        from .compare import golden_checks

        runner.checks.update(golden_checks(runner.model))
    source = (args.input or [None])[0]
    feeds = feeds_for(runner, source, "--input")
    if source is None:
        print("no --input: running on random normal input (seed 0)")
    for _ in range(args.runs):
        outputs = runner.run(feeds)
    for name, st in runner.last_stats.items():
        if st is not None:
            print(f"DPU subgraph {name}: {st.instructions} instructions executed, ended={st.ended}")
    names = [s.name for s in runner.outputs]
    print_outputs(outputs, names)
    if args.output:
        save_outputs(args.output, outputs, names)
    if args.verify:
        results = runner.verify_results
        bad = sum(r.mismatches for r in results)
        print(f"verify: {len(runner.checks)} DPU subgraph(s) of {who}'s code against tvm-dpu's golden reference "
              f"of the file's own quantized ops, {args.runs} run(s), {len(results)} subgraph calls, {bad} "
              "mismatching elements")
        for r in results:
            for note in r.first:
                print(f"  {r.subgraph}: {note}")
        return 1 if bad else 0
    return 0


def xmodel_report_header(model: XModel) -> tuple[dict, dict[str, bytes]]:
    """(a report header in the shape report_html.render_report reads, subgraph key -> machine code)."""
    dpus = model.dpu_subgraphs()
    if not dpus:
        raise XModelError(f"{model.source}: no DPU subgraph to report on")
    sub_id = {d.name: i for i, d in enumerate(dpus)}
    who = compiled_by(model)
    owner: dict[str, XSubgraph] = {op: sg for sg in model.root.children for op in sg.all_ops()}
    nodes, graph = [], []
    for op in model.ops:
        sg = owner.get(op.name)
        on_dpu = sg is not None and sg.device == "DPU"
        nodes.append({"name": op.name, "op": op.type, "device": "dpu" if on_dpu else "cpu",
                      "subgraph": sub_id[sg.name] if on_dpu else None,
                      "reason": f"{who} placed it in {sg.device if sg else 'no'} subgraph "
                                f"{sg.name if sg else ''}".strip()})
        graph.append({"name": op.name, "op": op.type, "inputs": op.input_ops})
    subs, codes = [], {}
    for d in dpus:
        key = f"sg{sub_id[d.name]}"
        codes[key] = d.mc_code

        def binding(t):
            return {"name": t.name, "shape": list(t.shape), "fix_point": t.fix_point,
                    "fmap": {"reg_id": t.reg_id, "offset": t.ddr_addr}}
        group_ops = [c.name for c in d.subgraph.children if c.name in set(d.attrs.get("children_topological_sort")
                                                                          or [c.name for c in d.subgraph.children])]
        subs.append({"key": key, "id": sub_id[d.name], "symbol": d.name, "instr_counts": dict(instr_counts(d)),
                     "op_ranges": [[g, 0, 0] for g in group_ops], "code_bytes": len(d.mc_code),
                     "param_bytes": sum(len(r.data or b"") for r in d.regions.values()),
                     "region_sizes": {str(r.reg_id): r.size for r in d.regions.values()},
                     "inputs": [binding(t) for t in d.inputs], "outputs": [binding(t) for t in d.outputs]})
    fp = dpus[0].fingerprint
    header = {"arch": {"name": dpus[0].dpu_name, "fingerprint": f"{fp:#018x}"},
              "partition": {"nodes": nodes, "subgraphs": len(dpus)}, "graph": graph, "subgraphs": subs,
              "cpu_libs": {}, "inputs": [], "outputs": []}
    return header, codes


def _report_arch(core: Any, board: str | None) -> Any:
    """The xmodel's core, or the board preset `board` carrying the same core (XModelError otherwise)."""
    if not board:
        return core
    from ..arch import load_arch

    b = load_arch(board)
    if b.dpu_name != core.dpu_name:
        raise XModelError(f"--board {board}: that board carries {b.dpu_name}, the xmodel's programs are for "
                          f"{core.dpu_name}")
    return b


def run_report(args: Any) -> int:
    """`tvm-dpu report m.xmodel -o r.html`: the HTML report with the timing model run on vai_c's programs (a
    program the timing model cannot schedule is named with the reason, the rest of the page stays)."""
    from ..arch import load_arch
    from ..report_html import Timing, render_report, subgraph_timing

    model = read_xmodel(args.artifact)
    header, codes = xmodel_report_header(model)
    from ..timing.params import TimingError, machine

    arch = _report_arch(load_arch(model.dpu_subgraphs()[0].fingerprint), getattr(args, "board", None))
    try:
        machine(arch)
        untimed = None
    except TimingError as e:  # a family with no timing model: say so once per subgraph, with nothing to add
        untimed = str(e)
    timings = {}
    for s in header["subgraphs"]:
        if untimed is not None:
            timings[s["key"]] = f"{s['symbol']}: {untimed}"
            continue
        t = subgraph_timing(np.frombuffer(codes[s["key"]], "<u4").astype(np.uint32), arch)
        if isinstance(t, str):
            t = (f"{s['symbol']}: {t} (the timing model follows the dependency tokens as tvm-dpu's own code "
                 "uses them; vai_c's programs use them differently, see the dependency-protocol issue)")
        timings[s["key"]] = t
    out = Path(args.output)
    page = render_report(header, {}, timings, Path(args.artifact).stem, Path(args.artifact).stat().st_size)
    out.write_text(page, encoding="utf-8")
    n_t = sum(isinstance(t, Timing) for t in timings.values())
    print(f"wrote {out} ({out.stat().st_size} bytes): {len(header['subgraphs'])} DPU subgraph(s) of "
          f"{compiled_by(model)} code, "
          f"{len(model.ops)} ops, timing for {n_t}/{len(timings)} subgraph(s)")
    for s in header["subgraphs"]:
        t = timings[s["key"]]
        print(f"  {s['symbol']}: {t.cycles:,} cycles" if isinstance(t, Timing) else f"  {t}")
    return 0
