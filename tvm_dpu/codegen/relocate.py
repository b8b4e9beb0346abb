"""Linking the segments of one DPU partition (virtual DPUs, backend/multicore.py) over one shared DDR region.

Each segment is compiled as a program of its own: its inputs in REG_INPUT, its outputs in REG_OUTPUT, each
program with its own layout. On a device every core addresses the same DDR, so the segments need not hand feature
maps through the host: `link_segments` gives every tensor a segment reads or writes (the partition's inputs and
outputs, and whatever one segment hands another) one slot of REG_SHARED at an offset fixed here, and rewrites the
reg_id and ddr_addr of every LOAD and SAVE that addressed REG_INPUT / REG_OUTPUT to that slot. A producer then
saves where its consumers load, one region serves all the cores, and the host only sequences the programs.

A slot keeps AUG_MARGIN bytes free on both sides of its tensor (a channel-augmented conv reads masked bytes just
outside its input map) and no two tensors share bytes, so segments running at once on different cores never
write what another reads. The instructions are otherwise untouched: each segment computes exactly what it
computed before (the bytes it reads and writes are the same, at other addresses).
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from tvm_dpu.codegen.conv import AUG_MARGIN
from tvm_dpu.codegen.isa import instr_spec, iter_program
from tvm_dpu.codegen.layout import align
from tvm_dpu.codegen.tiling import CodegenError
from tvm_dpu.types import REG_INPUT, REG_OUTPUT, REG_SHARED, CompiledSubgraph, FMap, TensorBinding

#: The regions a segment's own layout puts its inputs and outputs in: what linking moves into REG_SHARED.
_MOVED = (REG_INPUT, REG_OUTPUT)
#: LOAD / SAVE: the field giving the DDR distance between consecutive items (isa1-semantics.md 4, 5).
_PITCH = {"LOAD": "jump_read", "SAVE": "jump_write"}


def is_linked(segments: list[CompiledSubgraph]) -> bool:
    """Whether `segments` already address one shared region (none has an input or output region of its own)."""
    return all(REG_SHARED in s.region_sizes and not set(_MOVED) & set(s.region_sizes) for s in segments)


def shared_layout(segments: list[CompiledSubgraph]) -> tuple[dict[str, FMap], int]:
    """(tensor name -> its feature map in REG_SHARED, the region's size in bytes): one slot per tensor any segment
    reads or writes, in the order the segments name them, with AUG_MARGIN bytes free before and after each.
    CodegenError when two segments lay out one tensor differently (other shape or pitches)."""
    seen: dict[str, FMap] = {}
    for s in segments:
        for b in (*s.inputs, *s.outputs):
            fm = b.fmap
            key = (fm.h, fm.w, fm.c, fm.pixel_pitch, fm.row_pitch)
            old = seen.get(b.name)
            if old is not None and (old.h, old.w, old.c, old.pixel_pitch, old.row_pitch) != key:
                raise CodegenError(f"segment {s.name!r}: tensor {b.name!r} is laid out as {fm}, another segment "
                                   f"as {old}: they cannot share its bytes")
            seen.setdefault(b.name, fm)
    out: dict[str, FMap] = {}
    top = 0
    for name, fm in seen.items():
        out[name] = replace(fm, reg_id=REG_SHARED, offset=top + AUG_MARGIN)
        top += align(fm.nbytes + 2 * AUG_MARGIN)
    return out, top


def link_segments(segments: list[CompiledSubgraph]) -> list[CompiledSubgraph]:
    """The segments with their inputs and outputs moved into one REG_SHARED region (`shared_layout`): new code,
    bindings and region sizes; parameters and workspace as they were. Already linked segments come back as
    they are."""
    if is_linked(segments):
        return list(segments)
    layout, size = shared_layout(segments)
    out = []
    for s in segments:
        if REG_SHARED in s.region_sizes:
            raise CodegenError(f"segment {s.name!r} already uses DDR region {REG_SHARED}: cannot link it")
        moves = [(b.fmap, layout[b.name]) for b in (*s.inputs, *s.outputs)]
        code = relocate(s.code, moves, s.name)

        def moved(bs: list[TensorBinding]) -> list[TensorBinding]:
            return [replace(b, fmap=layout[b.name]) for b in bs]

        sizes = {r: n for r, n in s.region_sizes.items() if r not in _MOVED}
        sizes[REG_SHARED] = size
        out.append(replace(s, code=code, region_sizes=sizes, inputs=moved(s.inputs), outputs=moved(s.outputs)))
    return out


def relocate(code: np.ndarray, moves: list[tuple[FMap, FMap]], what: str) -> np.ndarray:
    """`code` with every LOAD / SAVE that addresses a map `src` of `moves` (by the bytes it reaches: an access
    overlapping the map's bytes belongs to it) pointed at `dst` instead: reg_id and ddr_addr rewritten, the
    offset within the map kept. CodegenError for an access to REG_INPUT / REG_OUTPUT that touches no map or
    more than one, or that would leave the slot `dst` lies in."""
    words = np.array(code, dtype=np.uint32, copy=True).reshape(-1)
    fields = {name: {f.name: f for f in instr_spec(name).fields} for name in _PITCH}
    for pos, ins in iter_program(words, shared=True):
        if ins.name not in _PITCH or ins["reg_id"] not in _MOVED:
            continue
        reg, addr = ins["reg_id"], ins["ddr_addr"]
        end = addr + (ins["length"] - 1) * ins[_PITCH[ins.name]] + ins["channel"]
        hits = [(src, dst) for src, dst in moves
                if src.reg_id == reg and addr < src.offset + src.nbytes and src.offset < end]
        if len(hits) != 1:
            raise CodegenError(f"{what}: {ins.name} at word {pos} reaches bytes {addr}..{end} of DDR region {reg}, "
                               f"which {'no' if not hits else 'more than one'} input or output map covers: "
                               "cannot move it into the shared region")
        src, dst = hits[0]
        new = addr - src.offset + dst.offset
        if new < dst.offset - AUG_MARGIN or end - src.offset > dst.nbytes + AUG_MARGIN:
            raise CodegenError(f"{what}: {ins.name} at word {pos} reaches {src.offset - addr} bytes before or "
                               f"{end - src.offset - src.nbytes} past its map, more than the {AUG_MARGIN} a shared "
                               "slot keeps free")
        f = fields[ins.name]
        for name, value in (("reg_id", REG_SHARED), ("ddr_addr", new)):
            spec = f[name]
            mask = (1 << spec.len) - 1
            if not 0 <= value <= mask:
                raise CodegenError(f"{what}: {ins.name} at word {pos}: {name}={value} does not fit its field")
            w = pos + spec.word
            words[w] = (int(words[w]) & ~(mask << spec.pos) & 0xFFFFFFFF) | (value << spec.pos)
    return words
