"""`tvm-dpu report`: one self-contained HTML page describing a compiled artifact.

Sections: summary (arch, inputs/outputs, sizes), the partitioned graph as inline SVG (DPU nodes coloured by
subgraph, CPU nodes grey, with the reason a node stayed on the CPU as its tooltip; the whole graph, scrolling
sideways only) and below it a table of every node's placement with that reason, a table per DPU subgraph
(instructions, DDR, fix_points, simulated cycles) and each subgraph's engine timeline.

Cycles and the timeline come from the timing model (`tvm_dpu.timing.simulate(code, arch)`), called through
`subgraph_timing`, the one place that knows its result type. When the timing model is not installed the page
says so in place of the numbers (TIMING HOOK). No external resources: no scripts, fonts or images are fetched.
"""
from __future__ import annotations

import html
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

#: Engines of the timeline, in display order, with their colours.
ENGINES = (("LOAD", "#2f7ed8"), ("CONV", "#d9534f"), ("MISC", "#8e5bb5"), ("SAVE", "#3a9d5d"))
_ENGINE_OF = {"LOAD": "LOAD", "SAVE": "SAVE", "CONV": "CONV", "CONVINIT": "CONV", "ALU": "MISC",
              "ALUINIT": "MISC", "ELEW": "MISC", "ELEWINIT": "MISC", "POOL": "MISC", "POOLINIT": "MISC",
              "DPTWISE": "MISC", "DWINIT": "MISC", "END": "MISC"}
_DPU_FILLS = ("#cfe3fb", "#d4f0dc", "#fde2c8", "#e6dcf7", "#fbd5e0", "#d6f2f2")
_DPU_STROKES = ("#2f6db5", "#2e8a4e", "#c56a1b", "#6d4bb0", "#b83b62", "#2a8c8c")


@dataclass
class Timing:
    """What the report needs from the timing model for one subgraph."""

    cycles: int
    latency_s: float | None = None
    engine_busy: dict[str, int] = field(default_factory=dict)
    events: list[tuple[str, int, int, str]] = field(default_factory=list)  # (engine, start, end, label)
    ops: list[tuple[str, float]] = field(default_factory=list)  # (op name, cycles) per coarse op


def onnx_node_graph(model: Any) -> list[dict]:
    """[{"name", "op", "inputs": [producer node names]}] of an ONNX ModelProto, in graph order."""
    producer: dict[str, str] = {}
    nodes = []
    for i, node in enumerate(model.graph.node):
        name = node.name or f"{node.op_type}_{i}"
        nodes.append({"name": name, "op": node.op_type,
                      "inputs": sorted({producer[t] for t in node.input if t in producer})})
        for t in node.output:
            producer[t] = name
    return nodes


# ---------------------------------------------------------------------------------------------------------
# TIMING HOOK: the only coupling to tvm_dpu.timing.
# ---------------------------------------------------------------------------------------------------------
def subgraph_timing(code: Any, arch: Any, op_ranges: Any = None) -> Timing | str:
    """Timing of one subgraph's machine code, or a sentence saying why there is none."""
    try:
        from tvm_dpu.timing.simulate import simulate
    except ImportError:
        return "timing model not available (tvm_dpu.timing.simulate is missing in this installation)"
    try:
        result = simulate(code, arch, op_ranges=op_ranges)
    except Exception as e:  # the report must still render if the model rejects a program
        return f"timing model failed: {type(e).__name__}: {e}"
    return _timing_from(result)


def _timing_from(result: Any) -> Timing | str:
    """Adapt a tvm_dpu.timing TimingResult (cycles, engine_busy, names/engine_of/start/end arrays, ops)."""
    from tvm_dpu.timing.cost import ENGINES as TIMING_ENGINES

    cycles = _first_attr(result, ("cycles", "total_cycles"))
    if cycles is None:
        return f"timing model result {type(result).__name__} has no total cycles"
    busy = {str(k).upper(): int(round(v)) for k, v in dict(_first_attr(result, ("engine_busy",)) or {}).items()}
    names = list(getattr(result, "names", []) or [])
    engine_of = list(getattr(result, "engine_of", []))
    start = list(getattr(result, "start", []))
    end = list(getattr(result, "end", []))
    events = [(TIMING_ENGINES[int(e)].upper(), int(s0), int(math.ceil(e0)), str(nm))
              for nm, e, s0, e0 in zip(names, engine_of, start, end)]
    ops = [(o.name, float(o.cycles)) for o in getattr(result, "ops", []) or []]
    t = Timing(int(round(float(cycles))), _first_attr(result, ("latency_s",)), busy, events)
    t.ops = ops
    return t


def _first_attr(obj: Any, names: tuple[str, ...]) -> Any:
    for n in names:
        v = obj.get(n) if isinstance(obj, dict) else getattr(obj, n, None)
        if v is not None:
            return v
    return None


# ---------------------------------------------------------------------------------------------------------
# SVG pieces
# ---------------------------------------------------------------------------------------------------------
def _esc(x: Any) -> str:
    return html.escape(str(x), quote=True)


def graph_svg(nodes: list[dict], placement: dict[str, dict]) -> str:
    """Layered drawing (longest-path ranks, barycentre ordering) of the node graph, top to bottom."""
    if not nodes:
        return "<p class='note'>The artifact carries no node graph.</p>"
    index = {n["name"]: i for i, n in enumerate(nodes)}
    rank: dict[str, int] = {}
    for n in nodes:  # graph order is topological for ONNX
        rank[n["name"]] = 1 + max((rank[p] for p in n["inputs"] if p in rank), default=-1)
    layers: dict[int, list[str]] = {}
    for n in nodes:
        layers.setdefault(rank[n["name"]], []).append(n["name"])
    w, h, gx, gy = 176, 32, 22, 20
    xpos: dict[str, float] = {}
    width_n = max(len(v) for v in layers.values())
    for r in sorted(layers):
        names = layers[r]
        preds = {nm: [xpos[p] for p in nodes[index[nm]]["inputs"] if p in xpos] for nm in names}
        names.sort(key=lambda nm: (sum(preds[nm]) / len(preds[nm]) if preds[nm] else 0.0, index[nm]))
        for i, nm in enumerate(names):
            xpos[nm] = (i - (len(names) - 1) / 2) * (w + gx)
    margin = 12
    lane_w = 10  # long edges run in lanes beside the boxes they skip
    lanes = sum(1 for n in nodes for p in n["inputs"] if p in rank and rank[n["name"]] - rank[p] > 1)
    side = min(lanes, 12) * lane_w + 16 if lanes else 0
    mx = margin + side
    total_w = width_n * (w + gx) - gx + 2 * mx
    total_h = (max(layers) + 1) * (h + gy) - gy + 2 * margin
    cx0 = total_w / 2

    def box(nm: str) -> tuple[float, float]:
        return cx0 + xpos[nm] - w / 2, margin + rank[nm] * (h + gy)

    parts = [f"<svg xmlns='http://www.w3.org/2000/svg' width='{total_w:.0f}' height='{total_h:.0f}' "
             f"viewBox='0 0 {total_w:.0f} {total_h:.0f}' class='graph' role='img' aria-label='partitioned graph'>",
             "<defs><marker id='arr' viewBox='0 0 8 8' refX='7' refY='4' markerWidth='7' markerHeight='7' "
             "orient='auto'><path d='M0,0 L8,4 L0,8 z' fill='#8a94a6'/></marker></defs>"]
    lane_used = {"l": 0, "r": 0}
    for n in nodes:
        x1, y1 = box(n["name"])
        for p in n["inputs"]:
            if p not in xpos:
                continue
            x0, y0 = box(p)
            sx, sy, ex, ey = x0 + w / 2, y0 + h, x1 + w / 2, y1
            span = rank[n["name"]] - rank[p]
            if span <= 1:
                my = (sy + ey) / 2
                d = f"M{sx:.1f},{sy:.1f} C{sx:.1f},{my:.1f} {ex:.1f},{my:.1f} {ex:.1f},{ey - 1:.1f}"
            else:  # skip edge: out to a lane beside every box of the ranks in between, down, back in
                between = [cx0 + xpos[m] for r in range(rank[p] + 1, rank[n["name"]]) for m in layers[r]]
                right = (sx + ex) / 2 >= cx0
                k = lane_used["r" if right else "l"] % 12
                lane_used["r" if right else "l"] += 1
                lx = (max(between) + w / 2 + 10 + k * lane_w) if right else (min(between) - w / 2 - 10 - k * lane_w)
                ya, yb = sy + gy / 2, ey - gy / 2
                d = (f"M{sx:.1f},{sy:.1f} C{sx:.1f},{ya:.1f} {lx:.1f},{sy:.1f} {lx:.1f},{ya + 4:.1f} "
                     f"L{lx:.1f},{yb - 4:.1f} C{lx:.1f},{ey:.1f} {ex:.1f},{yb:.1f} {ex:.1f},{ey - 1:.1f}")
            parts.append(f"<path d='{d}' fill='none' stroke='#8a94a6' stroke-width='1.2' marker-end='url(#arr)'/>")
    for n in nodes:
        x, y = box(n["name"])
        p = placement.get(n["name"], {})
        sg = p.get("subgraph")
        dev = p.get("device") or "cpu"
        on_dpu = dev == "dpu"
        fill, stroke = (_DPU_FILLS[sg % len(_DPU_FILLS)], _DPU_STROKES[sg % len(_DPU_STROKES)]) if on_dpu and \
            sg is not None else (("#fff3d6", "#c98a00") if dev != "cpu" else ("#eceff3", "#7b8494"))
        tip = f"{n['name']} ({n['op']}): " + (f"DPU subgraph {sg}" if on_dpu else f"CPU. {p.get('reason') or ''}"
                                               if dev == "cpu" else f"custom IP {dev} (plugin subgraph {sg})")
        label = n["name"] if len(n["name"]) <= 18 else n["name"][:17] + "\u2026"
        tag = f"DPU {sg}" if on_dpu else ("CPU" if dev == "cpu" else dev)
        parts.append(f"<g><title>{_esc(tip)}</title><rect x='{x:.1f}' y='{y:.1f}' width='{w}' height='{h}' rx='6' "
                     f"fill='{fill}' stroke='{stroke}' stroke-width='1.5'/>"
                     f"<text x='{x + 8:.1f}' y='{y + 14:.1f}' class='nn'>{_esc(label)}</text>"
                     f"<text x='{x + 8:.1f}' y='{y + 27:.1f}' class='no'>{_esc(n['op'])}</text>"
                     f"<text x='{x + w - 8:.1f}' y='{y + 27:.1f}' class='nt' fill='{stroke}'>{tag}</text></g>")
    parts.append("</svg>")
    return "".join(parts)


def timeline_svg(t: Timing, width: int = 980) -> str:
    """Engine rows over cycles; events closer than one pixel are merged so big programs stay small."""
    label_w, row_h, top = 56, 22, 18
    plot_w = width - label_w - 10
    total = max(t.cycles, max((e for _, _, e, _ in t.events), default=1), 1)
    scale = plot_w / total
    rows = [name for name, _ in ENGINES] + sorted({e for e, *_ in t.events} - {n for n, _ in ENGINES})
    colours = dict(ENGINES)
    height = top + len(rows) * row_h + 24
    parts = [f"<svg xmlns='http://www.w3.org/2000/svg' width='{width}' height='{height}' class='timeline' "
             f"role='img' aria-label='engine timeline'>"]
    for i, eng in enumerate(rows):
        y = top + i * row_h
        parts.append(f"<text x='0' y='{y + 15}' class='eng'>{eng}</text>"
                     f"<rect x='{label_w}' y='{y + 3}' width='{plot_w}' height='{row_h - 6}' fill='#f3f5f8'/>")
        spans = sorted((s, e) for en, s, e, _ in t.events if en == eng)
        merged: list[list[float]] = []
        for s, e in spans:
            xs, xe = label_w + s * scale, label_w + e * scale
            if merged and xs <= merged[-1][1] + 1.0:
                merged[-1][1] = max(merged[-1][1], xe)
            else:
                merged.append([xs, xe])
        for xs, xe in merged:
            parts.append(f"<rect x='{xs:.1f}' y='{y + 3}' width='{max(xe - xs, 0.8):.1f}' height='{row_h - 6}' "
                         f"fill='{colours.get(eng, '#777')}'/>")
    axis_y = top + len(rows) * row_h + 14
    for k in range(5):
        c = total * k / 4
        x = label_w + c * scale
        anchor = "start" if k == 0 else ("end" if k == 4 else "middle")
        parts.append(f"<text x='{x:.1f}' y='{axis_y}' class='tick' text-anchor='{anchor}'>{int(c):,}</text>")
    parts.append(f"<text x='{label_w}' y='11' class='tick'>cycles</text></svg>")
    return "".join(parts)


# ---------------------------------------------------------------------------------------------------------
# The page
# ---------------------------------------------------------------------------------------------------------
_CSS = """
body{font-family:-apple-system,'Segoe UI',Roboto,'DejaVu Sans',Arial,sans-serif;margin:0;background:#f6f7f9;color:#1d2430}
header{background:#1f2a3a;color:#fff;padding:18px 28px}header h1{margin:0;font-size:22px;font-weight:600}
header p{margin:4px 0 0;color:#b9c3d3;font-size:13px}
main{padding:18px 28px;max-width:1200px}
section{background:#fff;border:1px solid #dde2ea;border-radius:8px;padding:14px 18px;margin-bottom:16px}
h2{font-size:16px;margin:0 0 10px}h3{font-size:14px;margin:14px 0 6px}
table{border-collapse:collapse;font-size:13px}th,td{padding:4px 10px;border-bottom:1px solid #edf0f4;text-align:left}
th{background:#f3f5f8;font-weight:600}td.num,th.num{text-align:right;font-variant-numeric:tabular-nums}
.kv{display:grid;grid-template-columns:max-content auto;gap:4px 16px;font-size:13px}.kv b{font-weight:600}
.graphbox{overflow-x:auto;text-align:center;border:1px solid #edf0f4;border-radius:6px;background:#fbfcfd}
.legend{font-size:12px;margin:0 0 8px}.sw{display:inline-block;width:12px;height:12px;border-radius:3px;
vertical-align:-2px;margin:0 4px 0 12px;border:1px solid #888}
.nn{font-size:12px;font-weight:600;fill:#1d2430}.no{font-size:11px;fill:#4a5466}.nt{font-size:10px;text-anchor:end;
font-weight:600}.eng{font-size:11px;font-weight:600;fill:#4a5466}.tick{font-size:10px;fill:#6b7485}
.note{font-size:13px;color:#8a5a00;background:#fff7e6;border:1px solid #f3d9a4;padding:6px 10px;border-radius:6px}
.sym{font-size:12px;color:#4a5466;word-break:break-all}
td.reason{white-space:normal;max-width:640px}summary{cursor:pointer;font-size:13px;margin:10px 0 6px}
code{font-size:12px;background:#f3f5f8;padding:1px 4px;border-radius:3px}
"""


def _short(text: str, n: int = 90) -> str:
    return text if len(text) <= n else text[: n - 1] + "\u2026"


def _dpu_time(timings: dict[str, Timing | str]) -> str:
    ts = [t for t in timings.values() if isinstance(t, Timing)]
    if not ts or len(ts) != len(timings):
        return ""
    cyc = sum(t.cycles for t in ts)
    lat = sum(t.latency_s or 0.0 for t in ts)
    return (f"<b>DPU time</b><span>{cyc:,} cycles, {lat * 1e3:.3f} ms on one core (timing model; CPU parts not "
            "included)</span>")


def _op_span(s: dict) -> str:
    ops = [r[0] for r in s.get("op_ranges") or []]
    if not ops:
        return ""
    return ops[0] if len(ops) == 1 else f"{ops[0]} \u2192 {ops[-1]} ({len(ops)} ops)"


def _placement_table(nodes: list[dict]) -> str:
    """Every node with its device, DPU subgraph and, for a CPU node, why it is not on the DPU."""
    if not nodes:
        return ""
    rows = "".join(f"<tr><td>{_esc(n['name'])}</td><td>{_esc(n['op'])}</td><td>{_esc(n['device'])}</td>"
                   f"<td class='num'>{'' if n.get('subgraph') is None else _esc(n['subgraph'])}</td>"
                   f"<td class='reason'>{_esc(n.get('reason') or '')}</td></tr>" for n in nodes)
    n_cpu = sum(1 for n in nodes if n["device"] != "dpu")
    return (f"<details{' open' if n_cpu else ''}><summary>Placement of every node ({n_cpu} on the CPU, with the "
            "reason)</summary><table class='placement'><tr><th>node</th><th>op</th><th>device</th>"
            f"<th class='num'>subgraph</th><th>reason</th></tr>{rows}</table></details>")


def _summary_section(header: dict, sizes: dict[str, int], timings: dict[str, Timing | str], part: dict,
                     artifact_bytes: int) -> str:
    arch = header["arch"]
    n_dpu = sum(1 for n in part["nodes"] if n["device"] == "dpu")
    io = "".join(f"<b>{k}</b><span>{_esc(t['name'])} {_esc(tuple(t['shape']))} {_esc(t['dtype'])}"
                 + (f", fix_point {_esc(t['fix_point'])}" if t.get("fix_point") is not None else "") + "</span>"
                 for k, key in (("input", "inputs"), ("output", "outputs")) for t in header.get(key) or [])
    return ("<section><h2>Summary</h2><div class='kv'>"
            f"<b>DPU</b><span>{_esc(arch['name'])}</span>"
            f"<b>nodes</b><span>{len(part['nodes'])} ({n_dpu} on the DPU in {len(header['subgraphs'])} "
            f"subgraph(s), {len(part['nodes']) - n_dpu} on the CPU)</span>{io}"
            f"{_dpu_time(timings)}"
            f"<b>artifact</b><span>{artifact_bytes:,} bytes (TVM library with the DPU programs: "
            + ", ".join(f"{_esc(m)} {sizes.get(str(sec), 0):,} B"
                        for m, sec in sorted((header.get('cpu_libs') or {}).items())) + ")"
            "</span></div></section>")


def _graph_section(header: dict, part: dict) -> str:
    placement = {n["name"]: n for n in part["nodes"]}
    nodes = header.get("graph") or [{"name": n["name"], "op": n["op"], "inputs": [part["nodes"][i - 1]["name"]]
                                     if i else []} for i, n in enumerate(part["nodes"])]
    ids = sorted({n["subgraph"] for n in part["nodes"] if n["device"] == "dpu" and n["subgraph"] is not None})
    legend = "".join(f"<span class='sw' style='background:{_DPU_FILLS[i % len(_DPU_FILLS)]};border-color:"
                     f"{_DPU_STROKES[i % len(_DPU_STROKES)]}'></span>DPU subgraph {i}" for i in ids)
    return ("<section><h2>Partitioned graph</h2><p class='legend'>" + legend +
            "<span class='sw' style='background:#eceff3'></span>CPU (the table below gives the reason)</p>"
            f"<div class='graphbox'>{graph_svg(nodes, placement)}</div>" + _placement_table(part["nodes"])
            + "</section>")


def _subgraph_row(s: dict, t: Timing | str | None) -> str:
    n_ins = sum(s["instr_counts"].values())
    if isinstance(t, Timing):
        cyc = f"{t.cycles:,}"
        lat = f"{t.latency_s * 1e3:.3f}" if t.latency_s else "-"
    else:
        cyc = lat = "-"
    return (f"<tr><td>{_esc(s.get('id'))}</td><td>{_esc(_op_span(s))}</td>"
            f"<td class='num'>{len(s['op_ranges'])}</td><td class='num'>{n_ins:,}</td>"
            f"<td class='num'>{s.get('code_bytes', 0):,}</td>"
            f"<td class='num'>{s.get('param_bytes', 0):,}</td>"
            f"<td class='num'>{sum(int(v) for v in s['region_sizes'].values()):,}</td>"
            f"<td class='num'>{cyc}</td><td class='num'>{lat}</td></tr>")


def _subgraphs_section(header: dict, timings: dict[str, Timing | str]) -> str:
    rows = [_subgraph_row(s, timings.get(s["key"])) for s in _by_id(header["subgraphs"])]
    out = ["<section><h2>DPU subgraphs</h2><table><tr><th>id</th><th>first op \u2192 last op</th><th class='num'>ops</th>"
           "<th class='num'>instructions</th><th class='num'>code B</th><th class='num'>params B</th>"
           "<th class='num'>DDR B</th><th class='num'>cycles</th><th class='num'>latency ms</th></tr>" +
           "".join(rows) + "</table>"]
    plugin_rows = "".join(f"<tr><td>{_esc(p['symbol'])}</td><td>{_esc(p['device'])}</td><td>{_esc(p['plugin'])} "
                          f"{_esc(p['version'])}</td><td>{_esc(', '.join(p['nodes']))}</td></tr>"
                          for p in header.get("plugin_subgraphs") or [])
    if plugin_rows:
        out.append("<h3>Custom-IP plugin subgraphs</h3><table><tr><th>symbol</th><th>device</th><th>plugin</th>"
                   "<th>nodes</th></tr>" + plugin_rows + "</table>")
    missing = {t for t in timings.values() if isinstance(t, str)}
    for m in sorted(missing):
        out.append(f"<p class='note'>Cycles and timeline: {_esc(m)}.</p>")
    out.append("</section>")
    return "".join(out)


def _timeline_part(t: Timing | str | None) -> str:
    if isinstance(t, Timing) and t.events:
        busy = ", ".join(f"{k} {v / max(t.cycles, 1):.0%}" for k, v in t.engine_busy.items())
        body = timeline_svg(t) + (f"<p style='font-size:12px'>engine busy share: {_esc(busy)}</p>"
                                  if busy else "")
        if t.ops:
            top = sorted(t.ops, key=lambda o: -o[1])[:8]
            body += ("<h3>Slowest ops</h3><table><tr><th>op</th><th class='num'>cycles</th>"
                     "<th class='num'>share</th></tr>" +
                     "".join(f"<tr><td>{_esc(n)}</td><td class='num'>{c:,.0f}</td>"
                             f"<td class='num'>{c / max(t.cycles, 1):.1%}</td></tr>" for n, c in top) +
                     "</table>")
        return body
    if isinstance(t, Timing):
        return f"<p class='note'>{t.cycles:,} cycles; the timing model gave no per-instruction schedule.</p>"
    return f"<p class='note'>{_esc(t)}.</p>"


def _subgraph_section(s: dict, t: Timing | str | None) -> str:
    counts = ", ".join(f"{k} {v}" for k, v in sorted(s["instr_counts"].items()))
    tensors = "".join(f"<tr><td>{kind}</td><td>{_esc(b['name'])}</td><td>{_esc(tuple(b['shape']))}</td>"
                      f"<td class='num'>{b['fix_point']}</td><td class='num'>{b['fmap']['reg_id']}</td>"
                      f"<td class='num'>{b['fmap']['offset']:,}</td></tr>"
                      for kind in ("input", "output") for b in s[kind + "s"])
    return (f"<section><h2>DPU subgraph {_esc(s.get('id'))}: {_esc(_op_span(s))}</h2>"
            f"<p class='sym' title='{_esc(s['symbol'])}'>Relax function <code>{_esc(_short(s['symbol']))}"
            "</code></p>"
            f"<p style='font-size:13px'>instructions: {_esc(counts)}</p><table><tr><th>tensor</th><th>name</th><th>shape</th>"
            "<th class='num'>fix_point</th><th class='num'>DDR reg</th><th class='num'>offset</th></tr>"
            f"{tensors}</table><h3>Engine timeline</h3>" + _timeline_part(t) + "</section>")


def render_report(header: dict, sizes: dict[str, int], timings: dict[str, Timing | str], title: str,
                  artifact_bytes: int) -> str:
    """The HTML page for an artifact `header` (see artifact.py) and per-subgraph-key timings."""
    arch = header["arch"]
    part = header.get("partition") or {"nodes": [], "subgraphs": 0}
    out = [f"<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'><title>{_esc(title)} - tvm-dpu report"
           f"</title><style>{_CSS}</style></head><body>",
           f"<header><h1>{_esc(title)}</h1><p>tvm-dpu compiled model for {_esc(arch['name'])} "
           f"(fingerprint {_esc(arch['fingerprint'])})</p></header><main>",
           _summary_section(header, sizes, timings, part, artifact_bytes), _graph_section(header, part),
           _subgraphs_section(header, timings)]
    out += [_subgraph_section(s, timings.get(s["key"])) for s in _by_id(header["subgraphs"])]
    out.append("</main></body></html>\n")
    return "".join(out)


def write_report(artifact: Path, out: Path) -> str:
    """Write the HTML report of `artifact` to `out`; returns a one-line summary."""
    from tvm_dpu.arch import load_arch
    from tvm_dpu.errors import ArchError
    from tvm_dpu.runtime.artifact import read_code, read_header

    header, sizes = read_header(artifact)
    codes = read_code(artifact)
    try:
        arch = load_arch(header["arch"]["name"])
    except ArchError:
        from tvm_dpu.arch.arch import arch_from_fingerprint

        arch = arch_from_fingerprint(header["arch"]["fingerprint"])
    timings = {s["key"]: subgraph_timing(codes[s["key"]], arch, [tuple(r) for r in s["op_ranges"]])
               for s in header["subgraphs"]}
    page = render_report(header, sizes, timings, Path(artifact).stem, Path(artifact).stat().st_size)
    Path(out).write_text(page, encoding="utf-8")
    n_t = sum(isinstance(t, Timing) for t in timings.values())
    return (f"{len(header['subgraphs'])} DPU subgraph(s), {len((header.get('partition') or {}).get('nodes', []))} "
            f"nodes, timing for {n_t}/{len(timings)} subgraph(s)")



def _by_id(subgraphs: list[dict]) -> list[dict]:
    """Subgraphs in the report's subgraph-id order (the artifact stores them by symbol)."""
    return sorted(subgraphs, key=lambda s: (s.get("id") is None, s.get("id") or 0, s["key"]))


def render_pipeline(doc: dict, title: str) -> str:
    """HTML page of a multi-board pipeline (a pipeline.json document): the stages (board, arch, ops, predicted
    time, bytes sent) and a bar per stage of compute and link time, the bottleneck marked."""
    from tvm_dpu.pipeline.plan import load_link, stage_times_ms

    plan = doc.get("plan") or {}
    link = load_link(plan["link"]) if plan.get("link") else None
    stages = doc["stages"]
    periods = stage_times_ms(stages, plan.get("link"))
    times = [(c, l) for c, l, _ in periods]
    total = [p for _, _, p in periods]
    worst = max(range(len(stages)), key=lambda i: total[i])
    scale = 640.0 / max(max(c + l for c, l in times), 1e-12)
    bars = []
    for i, (c, l) in enumerate(times):
        y = 8 + i * 26
        bars.append(f'<text x="4" y="{y + 13}" class="eng">stage {i}</text>'
                    f'<rect x="70" y="{y}" width="{c * scale:.1f}" height="18" fill="#4c78a8"/>'
                    f'<rect x="{70 + c * scale:.1f}" y="{y}" width="{l * scale:.1f}" height="18" fill="#f58518"/>'
                    f'<text x="{76 + (c + l) * scale:.1f}" y="{y + 13}" class="tick">{total[i]:.3f} ms per frame'
                    f'{" (bottleneck)" if i == worst else ""}</text>')
    svg = (f'<svg width="900" height="{16 + 26 * len(stages)}" xmlns="http://www.w3.org/2000/svg">'
           + "".join(bars) + "</svg>")
    rows = "".join(
        f"<tr><td class=num>{s['index']}</td><td>{_esc(s['board'])}</td><td>{_esc(s['arch'])}</td>"
        f"<td class=num>{len(s['ops'])}</td><td>{_esc(_short(s['ops'][0], 40))} &hellip; "
        f"{_esc(_short(s['ops'][-1], 40))}</td><td class=num>{s['predicted_ms']:.3f}</td>"
        f"<td class=num>{s['send_bytes']}</td><td class=num>{times[i][1]:.3f}</td>"
        f"<td>{_esc(s.get('artifact', ''))}</td></tr>" for i, s in enumerate(stages))
    fps = 1e3 / total[worst] if total[worst] > 0 else float("inf")
    return (f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{_esc(title)} pipeline</title>"
            f"<style>{_CSS}</style></head><body><header><h1>{_esc(title)}: {len(stages)}-board pipeline</h1>"
            f"<p>link {_esc(plan.get('link', '?'))}; predicted {fps:.1f} frames/s, bottleneck stage {worst}</p>"
            "</header><main><section><h2>Stages</h2><table><tr><th class=num>stage</th><th>board</th><th>arch</th>"
            "<th class=num>ops</th><th>ops (first &hellip; last)</th><th class=num>predicted ms</th>"
            "<th class=num>bytes sent</th><th class=num>link ms</th><th>artifact</th></tr>"
            f"{rows}</table></section><section><h2>Stage times</h2><p class=legend>"
            "<span class=sw style='background:#4c78a8'></span>DPU (timing model)"
            "<span class=sw style='background:#f58518'></span>sending to the next board (link model; "
            f"{'overlapping the next frame, so a stage takes the longer of the two' if link is not None and link.overlap else 'after the compute'})</p>"
            f"{svg}</section></main></body></html>")
