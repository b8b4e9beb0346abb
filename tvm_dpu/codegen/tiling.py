"""How a sliding-window op's input rows sit in an image bank group, and how big a tile may be.

The engines fetch input rows with the row-fetch rule of isa1-semantics.md 3.3: fetched row h of an instruction
(stride S, offset 0, first bank b0 = 0 of the group) lives in bank `(h // S) % PP` at row
`A[(h // S) // PP] + (h % S) * E + x * J`. We always place a tile that way, with the wrap bases
`A[g] = base + g * S * E`, so a tile of fetched rows occupies `G * S * E` rows of every bank of the group, where
G is the number of bank wraps (at most 4: the instruction has four base addresses).
"""
from __future__ import annotations

from dataclasses import dataclass

from tvm_dpu.arch.arch import Arch
from tvm_dpu.codegen.layout import ceil_div
from tvm_dpu.errors import DPUError
from tvm_dpu.types import FMap


class CodegenError(DPUError):
    """An op the code generator cannot map onto the banks/fields of the selected DPU (names op and reason)."""


#: Maximum number of bank wraps one fetch may span (bank_addr_in, _1, _2, _3).
MAX_WRAPS = 4

#: Largest value of the 10-bit minus fields jump_read_endl / LOAD length / CONV length.
FIELD10 = 1024

#: Most output-channel groups one CONV chunk (one weight load, one SAVE per row) covers: a SAVE's 12-bit minus
#: channel field carries at most 4096 = 256 * 16 channels (OCP 16 on B4096), which is the Vitis AI table's
#: out_channels <= 256 * channel_parallel. A per-instruction limit: a conv with more output groups runs as
#: several chunks (conv.emit_conv), so its output-channel count is not limited.
OUT_GROUPS_MAX = 256


@dataclass(frozen=True)
class RowPlacement:
    """Placement of the fetched rows of one tile in an image bank group."""

    pp: int  # banks in the group
    stride: int  # S: stride_h of the consuming instruction
    endl: int  # E: rows between the line slots of one bank (= pixels per line * channel groups)
    pitch: int  # J: rows between consecutive pixels of a line (= channel groups)
    base: int  # A[0]
    b0: int = 0  # first bank of the fetch within the group (bank_id_in mod PP)

    def wraps(self, n_rows: int) -> int:
        """Bank wraps G needed by `n_rows` fetched rows."""
        return (self.b0 + (n_rows - 1) // self.stride) // self.pp + 1

    def footprint(self, n_rows: int) -> int:
        """Rows of every bank the tile occupies."""
        return self.wraps(n_rows) * self.stride * self.endl

    def bases(self) -> list[int]:
        """bank_addr_in, _1, _2, _3."""
        return [self.base + g * self.stride * self.endl for g in range(MAX_WRAPS)]

    def where(self, h: int) -> tuple[int, int]:
        """(bank index within the group, bank row of pixel 0) of fetched row h."""
        k = self.b0 + h // self.stride
        return k % self.pp, self.base + (k // self.pp) * self.stride * self.endl + (h % self.stride) * self.endl


def max_valid_rows(pp: int, vpp_max: int, kh: int, sh: int) -> int:
    """Largest vpp <= vpp_max whose fetched rows (vpp-1)*sh + kh need at most MAX_WRAPS bank wraps."""
    vpp = min(vpp_max, MAX_WRAPS * pp - (kh - 1) // sh)
    if vpp < 1:
        raise CodegenError(f"kernel height {kh} with stride {sh} needs more than {MAX_WRAPS} bank wraps of "
                           f"{pp} banks")
    return vpp


def conv_tile(arch: Arch, cin: int, kh: int, kw: int, sh: int, sw: int,
              n_groups: int) -> tuple[int, int, int] | None:
    """(vpp, L, chunk) of the widest CONV tile (vpp output rows, L output columns, chunk resident output-channel
    groups, at most `n_groups` and OUT_GROUPS_MAX) whose input window and output fit half an image bank, or None.

    Here rather than in conv.py because it is the bank-geometry rule alone (row-fetch wraps, 10-bit fields), which
    the fused emitters and the analytic timing model (tvm_dpu.timing.analytic) share with the CONV emitter."""
    half = arch.bank_depth // 2
    cg_in = ceil_div(cin, arch.icp)
    vpp = max_valid_rows(arch.pp, arch.pp, kh, sh)
    chunk = min(n_groups, OUT_GROUPS_MAX)
    while chunk >= 1:
        for v in range(vpp, 0, -1):
            nr = (v - 1) * sh + kh
            wraps = ((nr - 1) // sh) // arch.pp + 1
            e_max = min(FIELD10, half // (wraps * sh))
            in_cols = e_max // cg_in
            if in_cols < kw:
                continue
            lim = min((in_cols - kw) // sw + 1, half // chunk, FIELD10)
            if lim >= 1:
                return v, lim, chunk
        chunk //= 2
    return None


def split_even(total: int, max_part: int) -> list[tuple[int, int]]:
    """Split [0, total) into the fewest near-equal parts of at most max_part: [(start, size), ...]."""
    n = ceil_div(total, max_part)
    base, extra = divmod(total, n)
    out, s = [], 0
    for i in range(n):
        size = base + (1 if i < extra else 0)
        out.append((s, size))
        s += size
    return out


@dataclass(frozen=True)
class WindowTile:
    """The input window of one output tile (vpp rows from p0, `length` columns from q0) of a sliding-window op,
    placed in an image bank group: fetched row h / column x of the window is image row y0 + h / column x0 + x."""

    y0: int
    x0: int
    n_rows: int
    in_cols: int
    place: RowPlacement

    @staticmethod
    def of(pp: int, kh: int, kw: int, sh: int, sw: int, pads: tuple[int, int, int, int], p0: int, vpp: int,
           q0: int, length: int, groups: int, base: int, endl: int | None = None, b0: int = 0) -> "WindowTile":
        """`endl`: rows between line slots (default: the window's line, in_cols * groups); `b0`: first bank."""
        in_cols = (length - 1) * sw + kw
        return WindowTile(p0 * sh - pads[0], q0 * sw - pads[1], (vpp - 1) * sh + kh, in_cols,
                          RowPlacement(pp, sh, endl or in_cols * groups, groups, base, b0))

    def pads(self, x: FMap) -> tuple[int, int, int, int]:
        """Padding (top, left, bottom, right) the tile's window needs beyond the edges of x."""
        return (max(0, -self.y0), max(0, -self.x0), max(0, self.y0 + self.n_rows - x.h),
                max(0, self.x0 + self.in_cols - x.w))

    def emit_loads(self, prog, bank0: int, depth: int, x: FMap, x_res: str, c0: int, channels: int,
                   buf_res: tuple, per_row: bool = False) -> None:
        """One LOAD per image row of the window inside x (padding rows and columns are masked by the op); with
        `per_row`, fetched row h is its own resource buf_res + ("row", h), so a reader of some rows waits for
        those only."""
        pitch = self.place.pitch
        xs, xe = max(0, self.x0), min(x.w, self.x0 + self.in_cols)
        if xe <= xs:
            return
        for h in range(self.n_rows):
            yy = self.y0 + h
            if not 0 <= yy < x.h:
                continue
            bank, row0 = self.place.where(h)
            prog.emit("LOAD", reads=(("ddr", x_res),), writes=(buf_res + ("row", h) if per_row else buf_res,),
                      bank_id=bank0 + bank,
                      bank_addr=(row0 + (xs - self.x0) * pitch) % depth, length=xe - xs, channel=channels,
                      jump_read=x.pixel_pitch, jump_write=pitch, reg_id=x.reg_id, ddr_addr=x.addr(yy, xs, c0))


#: Largest augmented LOAD item in bytes, per unit of ICP: the fingerprint's LD_AUGM bit means
#: conv_engine.channel_augmentation = 2*ICP (isa1-semantics.md 2, dpu-facts.md: 32 on B4096). The LOAD's masking
#: fields work up to 64 channels (isa1-semantics.md 5.1), which 2*ICP never exceeds (ICP <= 16).
AUG_CHANNELS_PER_ICP = 2

#: The LOAD's 5-bit pad_start / pad_end fields (an augmented item's bytes in the left / right padding).
PAD5 = 31


def augmentable(arch: Arch, cin: int, kw: int, sw: int, pads: tuple[int, int, int, int] | None = None) -> bool:
    """Whether a conv over `cin` channels with kernel width kw and stride sw can run channel-augmented on `arch`
    (each LOAD item the kw*cin bytes of kw consecutive pixels, the conv a kh x 1 one over kw*cin channels) and
    it makes the CONVs shorter (fewer channel groups per kernel row than kw).

    The hardware's limit: a DPU built with channel augmentation (fingerprint bit 26) takes items of up to 2*ICP
    bytes. `pads` (top, left, bottom, right): the edge items of a padded conv lie partly in the padding, so the
    LOAD's 5-bit mask fields must cover them; None: only interior columns run augmented (no masks)."""
    icp, ch = arch.icp, kw * cin
    if not (arch.channel_augmentation and sw <= kw and ch <= AUG_CHANNELS_PER_ICP * icp
            and ceil_div(ch, icp) < kw * ceil_div(cin, icp)):
        return False
    if pads is None:
        return True
    pl, pr = pads[1], pads[3]
    return pl * cin <= PAD5 and pr * cin + ceil_div(ch, icp) * icp - ch <= PAD5 and ceil_div(pr, sw) <= 32


@dataclass(frozen=True)
class RasterTile:
    """An output tile of a raster-order tiling: tile row r holds the output pixels rows[r] = (first, count) in
    raster order (a row may cross image rows); every row is `length` CONV columns long, the last may hold fewer
    pixels (its CONV columns past the end are computed but neither loaded nor saved)."""

    length: int
    rows: tuple[tuple[int, int], ...]

    @property
    def vpp(self) -> int:
        return len(self.rows)

    def runs(self, r: int, w: int, addr, pitch: int) -> list[tuple[int, int, int]]:
        """Tile row r in a map: [(first pixel within the row, DDR address, pixels)], output pixel (oy, ox) of a
        raster of width w at `addr(oy, ox)`, consecutive pixels `pitch` bytes apart in DDR. Pieces within one
        image row, merged where the next starts where the previous one's pitch leads (a DDR-contiguous map):
        fewer, longer transfers (at most FIELD10 pixels each)."""
        k0, count = self.rows[r]
        out: list[list[int]] = []
        j, k, k1 = 0, k0, k0 + count
        while k < k1:
            oy, ox = divmod(k, w)
            n = min(w - ox, k1 - k)
            a = addr(oy, ox)
            if out and out[-1][1] + out[-1][2] * pitch == a and out[-1][2] + n <= FIELD10:
                out[-1][2] += n
            else:
                out.append([j, a, n])
            j += n
            k += n
        return [(j, a, n) for j, a, n in out]


@dataclass(frozen=True)
class RowTile:
    """An output tile of vpp image rows from p0 by `length` columns from q0, with RasterTile's interface."""

    p0: int
    q0: int
    vpp: int
    length: int

    def runs(self, r: int, w: int, addr, pitch: int) -> list[tuple[int, int, int]]:
        """Tile row r in a map whose pixel (oy, ox) is at `addr(oy, ox)`: one run (see RasterTile.runs)."""
        return [(0, addr(self.p0 + r, self.q0), self.length)]


def raster_tiles(n_pix: int, vpp: int, length: int, even: bool) -> list[RasterTile]:
    """Tiles covering output pixels [0, n_pix) in raster order, vpp rows of at most `length` pixels each.

    even=False: consecutive tiles of exactly vpp x length pixels (the last one shorter), for a caller that has
    already balanced `length` over the tiles (conv.flat_length). even=True: the fewest tiles vpp x length allows,
    of near-equal size, each spread over as few rows of one length as fit vpp (so their CONVs are even too)."""
    out = []
    if even:
        for k0, rest in split_even(n_pix, ceil_div(n_pix, ceil_div(n_pix, vpp * length))):
            ln = ceil_div(rest, vpp)
            out.append(RasterTile(ln, tuple((k0 + r * ln, min(ln, rest - r * ln))
                                            for r in range(ceil_div(rest, ln)))))
        return out
    for k0 in range(0, n_pix, vpp * length):
        v = min(vpp, ceil_div(n_pix - k0, length))
        out.append(RasterTile(length, tuple((k0 + r * length, min(n_pix, k0 + (r + 1) * length) - k0 - r * length)
                                            for r in range(v))))
    return out


def emit_raster_loads(prog, bank0: int, depth: int, tile: RasterTile, w: int, x: FMap, x_res: str, sh: int,
                      sw: int, channels: int, pitch: int, base: int, buf_res: tuple) -> None:
    """LOAD the input pixels of a raster tile of a pointwise op (output raster width w, stride sh x sw): tile row
    r into bank bank0 + r from row `base`, pixels `pitch` bank rows apart (row-fetch rule with stride 1, a
    single wrap)."""
    for r in range(tile.vpp):
        for j, a, n in tile.runs(r, w, lambda oy, ox: x.addr(oy * sh, ox * sw), sw * x.pixel_pitch):
            prog.emit("LOAD", reads=(("ddr", x_res),), writes=(buf_res,), bank_id=bank0 + r,
                      bank_addr=(base + j * pitch) % depth, length=n, channel=channels,
                      jump_read=sw * x.pixel_pitch, jump_write=pitch, reg_id=x.reg_id, ddr_addr=a)


@dataclass(frozen=True)
class PieceTile:
    """A windowed tile whose tile rows are independent pieces of output rows: tile row r computes the `length`
    columns of output row oy that end where piece pieces[r] = (oy, ox, count) ends (a shorter piece recomputes
    the `length - count` columns before it, which its SAVE skips: no window reads past the map). Its CONVs run with stride_h = kh, so tile row r reads fetched rows r*kh .. r*kh + kh - 1 alone
    (row-fetch rule with S = kh: all of them in bank r of the group, one wrap) and any piece may sit in any tile row.
    A last row band of v < vpp rows then fills the PP rows of one tile with column pieces of its rows instead of
    leaving vpp - v of them idle (VGG-16's 14x14 layers: rows 12-13 as four half rows, a CONV of 7 columns instead
    of 14). The window's padding is loaded as zeros (the CONV's pad masks act on the whole window, not on each
    piece), from `zero`, (reg_id, DDR address) of at least in_cols * channels zero bytes, None when no piece's
    window leaves the map."""

    pieces: tuple[tuple[int, int, int], ...]
    length: int
    kh: int
    kw: int
    sh: int
    sw: int
    top: int  # the conv's top / left padding: window row / column 0 of output (0, 0) is input (-top, -left)
    left: int
    place: RowPlacement
    zero: tuple[int, int] | None

    @staticmethod
    def of(pp: int, kh: int, kw: int, sh: int, sw: int, pads: tuple[int, int, int, int],
           pieces: tuple[tuple[int, int, int], ...], length: int, groups: int, base: int,
           zero: tuple[int, int] | None) -> "PieceTile":
        in_cols = (length - 1) * sw + kw
        return PieceTile(pieces, length, kh, kw, sh, sw, pads[0], pads[1],
                         RowPlacement(pp, kh, in_cols * groups, groups, base), zero)

    @property
    def n_rows(self) -> int:
        return len(self.pieces) * self.kh

    @property
    def in_cols(self) -> int:
        return (self.length - 1) * self.sw + self.kw

    def pads(self, x: FMap) -> tuple[int, int, int, int]:
        """No masks: the padding is in the banks (loaded zeros)."""
        return 0, 0, 0, 0

    def segments(self, x: FMap) -> list[tuple[int, int, int, int, int]]:
        """[(fetched row h, first window column, image row or -1 for zeros, first image column, columns)]: what
        the tile's LOADs write, the parts outside the map as zero runs."""
        out = []
        for r, (oy, ox, count) in enumerate(self.pieces):
            x0 = (ox + count - self.length) * self.sw - self.left
            for dy in range(self.kh):
                yy = oy * self.sh - self.top + dy
                xs, xe = (max(0, x0), min(x.w, x0 + self.in_cols)) if 0 <= yy < x.h else (x0, x0)
                h = r * self.kh + dy
                if xe <= xs:
                    out.append((h, 0, -1, 0, self.in_cols))
                    continue
                if xs > x0:
                    out.append((h, 0, -1, 0, xs - x0))
                out.append((h, xs - x0, yy, xs, xe - xs))
                if x0 + self.in_cols > xe:
                    out.append((h, xe - x0, -1, 0, x0 + self.in_cols - xe))
        return out

    def needs_zeros(self, x: FMap) -> bool:
        return any(yy < 0 for _, _, yy, _, _ in self.segments(x))

    def emit_loads(self, prog, bank0: int, depth: int, x: FMap, x_res: str, c0: int, channels: int,
                   buf_res: tuple) -> None:
        """One LOAD per window line inside x, one per zero run (from `zero`, read as packed pixels)."""
        pitch = self.place.pitch
        for h, col, yy, xs, n in self.segments(x):
            bank, row0 = self.place.where(h)
            addr = (row0 + col * pitch) % depth
            if yy < 0:
                if self.zero is None:
                    raise CodegenError("a piece tile's window leaves the map but the conv has no zero map")
                prog.emit("LOAD", reads=(("ddr", "params"),), writes=(buf_res,), bank_id=bank0 + bank,
                          bank_addr=addr, length=n, channel=channels, jump_read=channels, jump_write=pitch,
                          reg_id=self.zero[0], ddr_addr=self.zero[1])
            else:
                prog.emit("LOAD", reads=(("ddr", x_res),), writes=(buf_res,), bank_id=bank0 + bank,
                          bank_addr=addr, length=n, channel=channels, jump_read=x.pixel_pitch, jump_write=pitch,
                          reg_id=x.reg_id, ddr_addr=x.addr(yy, xs, c0))
