"""Tile geometry and data movement of the DPUV3E code generator (DPUCAHX8H): how a tile of an op's output maps to
the banks, and the LOADs / SAVEs that move feature-map rows between DDR and the banks.

The layout follows vai_c's U50 programs (tests/data/xmodel/dpucahx8h) and the row rules the DPUV3E emulator and
AMD's simulator share (emulator.banks.fetch_rows / store_rows): a feature-map pixel holds ceil(C / 16) bank rows
(`cg`), a tile row of `width` pixels `width * cg` rows (the engine's jump_read_endl), and the input rows of a
window engine with vertical stride S sit S to a bank, bank after bank over the PP banks of the group, a new base
address (bank_addr_in, _1, _2, _3) each time the group wraps. Input tiles go to VB0, output tiles to VB1, each in
one of two halves of the bank depth that successive tiles alternate between, so the next tile's LOADs can run
while the engines still work on the last one.
"""
from __future__ import annotations

from dataclasses import dataclass

from tvm_dpu.arch.arch import Arch
from tvm_dpu.codegen.layout import ceil_div
from tvm_dpu.codegen.program import Program
from tvm_dpu.codegen.tiling import CodegenError
from tvm_dpu.types import FMap
from tvm_dpu.xgraph.ops import Window  # the window engines' geometry (DPUV3E has no dilation: dh = dw = 1)

#: Base-address slots of a window instruction (bank_addr_in, _1, _2, _3): the input window may wrap the bank group
#: at most this many times.
ADDR_SLOTS = 4
#: Most pixels one CONV / POOL / DPTWISE / LOAD / SAVE row covers (the 10-bit minus-encoded `length`); ELEW's
#: length field has 9 bits.
MAX_LENGTH = 1024
MAX_ELEW_LENGTH = 512
#: Halves of the image banks that successive tiles alternate between (double buffering).
HALVES = 2


@dataclass(frozen=True)
class Tile:
    """Output rows [r0, r0 + rows) and columns [c0, c0 + cols) of one op, with where its input window and output
    sit in the banks."""

    r0: int
    rows: int
    c0: int
    cols: int
    in_half: int
    out_half: int


@dataclass(frozen=True)
class Banks:
    """The two image bank groups of the target (VB0 input, VB1 output) and their half depth."""

    vb_in: int
    vb_out: int
    pp: int
    half: int

    @staticmethod
    def of(arch: Arch) -> "Banks":
        img = [g for g in arch.bank_groups if g.kind == "image"]
        if len(img) < 2:
            raise CodegenError(f"{arch.target_label}: the DPUV3E code generator needs two image bank groups")
        return Banks(img[0].base_id, img[1].base_id, arch.pp, img[0].depth // HALVES)

    def in_base(self, t: Tile) -> int:
        return t.in_half * self.half

    def out_base(self, t: Tile) -> int:
        return t.out_half * self.half


def cgroups(c: int, cp: int = 16) -> int:
    return ceil_div(c, cp)


def window_rows(win: Window, rows: int) -> int:
    return (rows - 1) * win.sh + win.kh


def window_cols(win: Window, cols: int) -> int:
    return (cols - 1) * win.sw + win.kw


def plan_tiles(prog: Program, banks: Banks, win: Window, out_h: int, out_w: int, cg_in: int, cg_out: int, rows: int,
               max_length: int, what: str, col_align: int = 1) -> list[Tile]:
    """The op's tiles: bands of `rows` output rows (the engine's pixel parallelism, at most PP), each cut into
    column strips (a multiple of `col_align` wide) as wide as an input window of `cg_in` rows per pixel and an
    output of `cg_out` rows per pixel fit half a bank. Their halves continue the alternation of the program's
    tiles so far (`prog`'s "tile_half" slot), so an op's first tile LOADs into the half its producer's last tile
    left, while that tile still computes."""
    rows = max(1, min(rows, banks.pp, out_h))
    groups = (window_rows(win, rows) - 1) // win.sh
    if groups >= ADDR_SLOTS * banks.pp:
        raise CodegenError(f"{what}: a {rows}-row window of kernel {win.kh} / stride {win.sh} wraps the bank group "
                           f"more than {ADDR_SLOTS} times")
    per_row = (groups // banks.pp + 1) * win.sh * cg_in  # bank rows per input pixel column
    cols = min(out_w, max_length)
    while cols > 0 and (per_row * window_cols(win, cols) > banks.half or cols * cg_out > banks.half
                        or (cols % col_align and cols < out_w)):
        cols -= max(1, cols // 8) if cols % col_align == 0 else 1
    if cols <= 0:
        raise CodegenError(f"{what}: one output column of {cg_out} channel groups with a {win.kh}x{win.kw} window "
                           f"of {cg_in} channel groups does not fit half an image bank ({banks.half} rows)")
    tiles = []
    for r0 in range(0, out_h, rows):
        for c0 in range(0, out_w, cols):
            k = prog.next_slot("tile_half", HALVES)
            tiles.append(Tile(r0, min(rows, out_h - r0), c0, min(cols, out_w - c0), k, k))
    return tiles


@dataclass(frozen=True)
class InWindow:
    """Where a tile's input window sits: its first input row / column (negative inside the top / left padding),
    its width in pixels and row pitch in bank rows, and the base address of each group wrap."""

    top: int
    left: int
    cols: int
    endl: int
    bases: tuple[int, ...]


def in_window(banks: Banks, win: Window, t: Tile, cg_in: int) -> InWindow:
    cols = window_cols(win, t.cols)
    endl = cols * cg_in
    wraps = (window_rows(win, t.rows) - 1) // win.sh // banks.pp  # the last slot the window uses
    # a slot the window never reaches repeats the first (its own address could lie beyond the bank)
    bases = tuple(banks.in_base(t) + (g * win.sh * endl if g <= wraps else 0) for g in range(ADDR_SLOTS))
    return InWindow(t.r0 * win.sh - win.pads[0], t.c0 * win.sw - win.pads[1], cols, endl, bases)


def pads_of(win: Window, iw: InWindow, x: FMap, first: int, rows: int) -> dict[str, int]:
    """The pad fields of an instruction computing output rows [first, first + rows) of the tile: leading pads as
    counts, trailing ones as the last valid index of the last window (Conv/Pool/DptWise::pad)."""
    height, width = window_rows(win, rows), iw.cols
    top = iw.top + first * win.sh
    valid_h = min(height, x.h - top)
    valid_w = min(width, x.w - iw.left)
    return {"pad_top": max(0, -top), "pad_left": max(0, -iw.left),
            "pad_bottom": valid_h - height + win.kh - 1, "pad_right": valid_w - width + win.kw - 1}


def addr_fields(banks: Banks, iw: InWindow, first: int) -> dict[str, int]:
    """bank_id_in and the four base addresses of an instruction whose window starts at tile output row `first`."""
    return {"bank_id_in": banks.vb_in + first, "bank_addr_in": iw.bases[0], "bank_addr_in_1": iw.bases[1],
            "bank_addr_in_2": iw.bases[2], "bank_addr_in_3": iw.bases[3]}


def load_window(prog: Program, banks: Banks, win: Window, t: Tile, iw: InWindow, x: FMap, x_name: str,
                cg_in: int, comment: str) -> None:
    """LOAD the valid input rows of tile `t`'s window: window row i (input row iw.top + i) to bank i // S of the
    group (wrapping), at its group's base plus (i mod S) rows of the window; the padding is never loaded."""
    left = max(0, -iw.left)
    n = min(iw.cols, x.w - iw.left) - left
    res = ("vb_in", t.in_half)
    for i in reversed(range(window_rows(win, t.rows))):
        y = iw.top + i
        if not 0 <= y < x.h:
            continue
        g = i // win.sh
        addr = iw.bases[g // banks.pp] + (i % win.sh) * iw.endl + left * cg_in
        _load_row(prog, x, y, iw.left + left, n, banks.vb_in + g % banks.pp, addr, cg_in, res, x_name, comment)


def _load_row(prog: Program, x: FMap, y: int, x0: int, n: int, bank: int, addr: int, cg: int, res: tuple,
              x_name: str, comment: str) -> None:
    """LOAD pixels [x0, x0 + n) of row y of map x (all its channels) to `bank` from row `addr`, cg rows apart."""
    for s in range(0, n, MAX_LENGTH):
        m = min(MAX_LENGTH, n - s)
        prog.emit("LOAD", reads=[("ddr", x_name)], writes=[res], comment=comment,
                  bank_id=bank, bank_addr=addr + s * cg, length=m, channel=x.c, jump_read=x.pixel_pitch,
                  jump_write=cg, jump_read_endl=x.pixel_pitch * m, pad_idx=1, ddr_addr=x.addr(y, x0 + s),
                  reg_id=x.reg_id)


def load_rows(prog: Program, banks: Banks, t: Tile, x: FMap, x_name: str, cg: int, addr: int, comment: str) -> None:
    """LOAD rows [t.r0, t.r0 + t.rows) x columns of tile `t` of map x, row r to bank r of the input group at
    `addr` (the element-wise engine's layout: one row per bank)."""
    for r in range(t.rows):
        _load_row(prog, x, t.r0 + r, t.c0, t.cols, banks.vb_in + r, addr, cg, ("vb_in", t.in_half), x_name, comment)


def save_tile(prog: Program, banks: Banks, t: Tile, y: FMap, y_name: str, cg_out: int, comment: str) -> None:
    """SAVE the tile's output rows: row r from bank r of the output group (pixel pitch cg_out rows) to DDR."""
    for r in range(t.rows):
        prog.emit("SAVE", reads=[("vb_out", t.out_half)], writes=[("ddr", y_name)], comment=comment,
                  bank_id=banks.vb_out + r, bank_addr=banks.out_base(t), length=t.cols, channel=y.c,
                  jump_read=cg_out, jump_write=y.pixel_pitch, ddr_addr=y.addr(t.r0 + r, t.c0), reg_id=y.reg_id)
