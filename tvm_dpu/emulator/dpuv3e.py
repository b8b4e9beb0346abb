"""Functional emulator of the DPUV3E instruction set (DPUCAHX8H: Alveo U50 / U50LV / U280), bit-exact to AMD's VART
simulator (`sim-runner`, the `<DPUVersion::DPUV3E>` paths of Load/Save/Conv/Pool/DptWise/Elew.cpp).

A plain reading of the simulator, written for clarity rather than speed: each instruction is executed when it is
met, on banks built from the target's bank groups (presets.json, AMD's target prototxts). It shares with the
DPUCZDX8G emulator what the two instruction sets share: the fixed-point primitives (quant.fixpoint), the
activation rounding (emu_conv.activate) and the row fetch / store rules (banks.fetch_rows / store_rows). What
differs is here: a weight LOAD (bank_id 0x3F) reads output channels 0..OCP/2-1 from one DDR address and the others
from a second one; POOL and DPTWISE are engines of their own (PP from the target's engine data, not the CONV's);
ELEW adds with shift_read / shift_write scaling and has no multiply; SAVE has no argmax. Errors name the
instruction index and field, as the DPUCZDX8G emulator's do.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Mapping

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from tvm_dpu.arch.arch import Arch
from tvm_dpu.codegen.dpuv3e_fields import (AVG_TABLE_WIDTHS, SHIFT_BIAS_NEGATIVE, WEIGHT_LOAD_BANK, scale_exponent,
                                           shift_bias_exponent)
from tvm_dpu.codegen.isa import Instr, enum_codes, iter_program
from tvm_dpu.errors import EmulatorError
from tvm_dpu.types import REG_PARAMS
from tvm_dpu.quant.fixpoint import INT8_MIN, avgpool_factor, dpu_round
from tvm_dpu.emulator.banks import fetch_rows, store_rows
from tvm_dpu.emulator.conv import activate, exact_matmul_t
from tvm_dpu.emulator.context import Ctx
from tvm_dpu.timing.depcheck import Access

ISA = "DPUV3E"
#: LOAD channel-augmentation padding applies up to this many channels (Load.cpp MODE_AVG_CHANNEL_LIMIT).
PAD_MASK_CHANNEL_LIMIT = 64
#: Base-address slots of CONV / POOL / DPTWISE (bank_addr_in, _1, _2, _3).
ADDR_GROUPS = 4
SHIFT_BIAS_MAX = 20
#: ELEW works on inputs scaled by 4 (floor(x * 4 / 2**shift_read)), Elew<T>::calc.
ELEW_SCALE_BITS = 2
#: The simulator's Calc enumerations are shared by every DPU version, DPUV2's table names them.
ACT = enum_codes("act_type")
POOL = enum_codes("pool_type")


@dataclass
class EngineSpec:
    """One compute engine of the target: pixel / channel parallelism and its parameter bank groups."""

    pp: int
    cp: int
    weight_bank: str | None = None
    bias_bank: str | None = None


def engine_specs(arch: Arch) -> dict[str, EngineSpec]:
    """The target's engines (presets.json `engines`, from the prototxts' *_engine blocks); ArchError-free: a target
    without the data gets none, and an instruction of a missing engine is refused when met."""
    return {name: EngineSpec(**spec) for name, spec in arch.extra.get("engines", {}).items()}


class V3EBanks:
    """The on-chip banks of one core, one flat byte array per bank, sized from the target's bank groups. Reads and
    writes wrap around the bank (Bank::Read / Bank::Write); a write zero-fills the rest of its last row."""

    def __init__(self, arch: Arch):
        self.groups = {g.name: g for g in arch.bank_groups}
        self.mem: dict[int, np.ndarray] = {}
        self.width: dict[int, int] = {}
        self.depth: dict[int, int] = {}
        for g in arch.bank_groups:
            for i in g.ids:
                self.mem[i] = np.zeros(g.depth * g.width, np.uint8)
                self.width[i], self.depth[i] = g.width, g.depth
        self.image_ids = frozenset(i for g in arch.bank_groups if g.kind == "image" for i in g.ids)
        #: row key stride of one bank in an access record (bank * key_depth + row): the deepest bank's rows
        self.key_depth = max(self.depth.values())
        #: the Access the instruction being executed records its bank rows in (`record_accesses`); None: nothing
        self.trace: Access | None = None

    def _note(self, bank: int, addrs: np.ndarray, n: int, writes: bool) -> None:
        """Record the rows items of `n` bytes at `addrs` of `bank` touch (wrapping as the access does)."""
        rows = -(-n // self.width[bank])
        keys = (np.asarray(addrs, np.int64)[:, None] + np.arange(rows)) % self.depth[bank] + bank * self.key_depth
        (self.trace.bank_writes if writes else self.trace.bank_reads).append(keys.reshape(-1))

    def group_bank(self, group: str, index: int) -> int:
        return self.groups[group].base_id + index

    def read(self, bank: int, addr: int, n: int) -> np.ndarray:
        return self.read_many(bank, np.array([addr]), n)[0]

    def read_many(self, bank: int, addrs: np.ndarray, n: int) -> np.ndarray:
        """`read` at each address of `addrs`: shape (len(addrs), n)."""
        if self.trace is not None:
            self._note(bank, addrs, n, False)
        start = (np.asarray(addrs, np.int64) % self.depth[bank]) * self.width[bank]
        return self.mem[bank][(start[:, None] + np.arange(n)) % self.mem[bank].size]

    def write(self, bank: int, addr: int, data: np.ndarray) -> None:
        self.write_many(bank, np.array([addr]), np.asarray(data).reshape(1, -1))

    def write_many(self, bank: int, addrs: np.ndarray, data: np.ndarray) -> None:
        """`write` of data[i] at addrs[i], in order: where two writes touch the same byte the later one wins."""
        data = data.view(np.uint8) if data.dtype == np.int8 else data.astype(np.uint8, copy=False)
        if self.trace is not None:
            self._note(bank, addrs, data.shape[1], True)
        n = data.shape[1] + (-data.shape[1]) % self.width[bank]
        buf = np.zeros((data.shape[0], n), np.uint8)
        buf[:, :data.shape[1]] = data
        rows = np.asarray(addrs, np.int64) % self.depth[bank]
        idx = (rows[:, None] * self.width[bank] + np.arange(n)) % self.mem[bank].size
        ordered = np.sort(rows)  # items of n / width rows each are disjoint when consecutive starts are that far apart
        if np.diff(ordered, append=ordered[0] + self.depth[bank]).min() >= n // self.width[bank]:
            self.mem[bank][idx] = buf
        else:  # overlapping items: one at a time, as the simulator writes them
            for i in range(idx.shape[0]):
                self.mem[bank][idx[i]] = buf[i]


@dataclass
class V3EStats:
    """What one `DpuV3EEmulator.run` executed (the fields the xmodel runner and `compare` read)."""

    instructions: int = 0
    by_name: dict[str, int] = field(default_factory=dict)
    ended: bool = False
    load_bytes: int = 0
    save_bytes: int = 0


class DpuV3EEmulator:
    """Executes DPUV3E machine code against DDR regions {reg_id: uint8 array} (modified in place). Banks and the
    INIT registers persist across `run` calls; banks start zeroed. Execution stops at the first END."""

    def __init__(self, arch: Arch):
        if arch.instruction_set != ISA:
            raise EmulatorError(f"{arch.target_label}: instruction set {arch.instruction_set}, this emulator runs "
                                f"{ISA}")
        self.arch = arch
        self.engines = engine_specs(arch)
        self.banks = V3EBanks(arch)
        self.regions: dict[int, np.ndarray] = {}
        self.init: dict[str, Instr] = {}
        self.elew_fifo: list[Instr] = []
        self.stats = V3EStats()
        self._exec: dict[str, Callable[[Ctx], None]] = {
            "LOAD": self._load, "SAVE": self._save, "CONV": self._conv, "POOL": self._pool,
            "DPTWISE": self._dptwise, "ELEW": self._elew, "ELEWINIT": self._elewinit,
            "CONVINIT": self._keep_init, "POOLINIT": self._keep_init, "DWINIT": self._keep_init}

    def run(self, code: np.ndarray, regions: Mapping[int, np.ndarray],
            accesses: list[Access] | None = None) -> V3EStats:
        """Execute `code` up to its first END; with `accesses` (a list) append, per instruction executed, the bank
        rows and DDR bytes it read and wrote (timing.depcheck.Access, for the dependency checker's races)."""
        self.regions = dict(regions)
        self.stats = V3EStats()
        try:
            for index, (_, ins) in enumerate(iter_program(np.asarray(code, np.uint32), isa=ISA)):
                if accesses is not None:
                    self.banks.trace = Access()
                    accesses.append(self.banks.trace)
                if ins.name == "END":
                    self.stats.ended = True
                    break
                self.stats.instructions += 1
                self.stats.by_name[ins.name] = self.stats.by_name.get(ins.name, 0) + 1
                self._exec[ins.name](Ctx(index, ins, self.arch))
        finally:
            self.banks.trace = None
        return self.stats

    def record_accesses(self, code: np.ndarray, regions: Mapping[int, np.ndarray]) -> list[Access]:
        """`run`, returning one Access per instruction up to and including the END (the END touches nothing)."""
        accesses: list[Access] = []
        self.run(code, regions, accesses)
        return accesses

    def _ddr(self, ctx: Ctx, writes: bool, item: tuple[int, int, int, int, int]) -> None:
        """Record DDR items (reg_id, first byte, items, bytes per item, pitch) of the running instruction."""
        if self.banks.trace is not None:
            (self.banks.trace.ddr_writes if writes else self.banks.trace.ddr_reads).append(item)

    # ---- shared checks -------------------------------------------------------------------------------------
    def _region(self, ctx: Ctx, reg_field: str = "reg_id") -> np.ndarray:
        rid = int(ctx.ins.fields[reg_field])
        ctx.check(rid in self.regions, reg_field, f"DDR region {rid} is not defined (defined: {sorted(self.regions)})")
        return self.regions[rid]

    def _image_bank(self, ctx: Ctx, name: str) -> int:
        b = int(ctx.ins.fields[name])
        ctx.check(b in self.banks.image_ids, name, f"not an image bank of {self.arch.target_label}")
        return b

    def _engine(self, ctx: Ctx, name: str) -> EngineSpec:
        spec = self.engines.get(name)
        ctx.check(spec is not None, None, f"{self.arch.target_label} has no {name} engine")
        return spec

    def _init_of(self, ctx: Ctx, name: str) -> Instr:
        ins = self.init.get(name)
        ctx.check(ins is not None, None, f"no {name} before this {ctx.ins.name}")
        return ins

    def _check_act(self, ctx: Ctx, act: int, names: tuple[str, ...], engine: str) -> None:
        allowed = {ACT["none"]} | {ACT[n] for n in names}
        ctx.check(act in allowed, None, f"act_type {act} not allowed on the {self.arch.target_label} {engine} engine "
                                        f"(allowed {sorted(allowed)})")

    def _keep_init(self, ctx: Ctx) -> None:
        self.init[ctx.ins.name] = ctx.ins

    # ---- LOAD / SAVE -----------------------------------------------------------------------------------------
    def _load(self, ctx: Ctx) -> None:
        f = ctx.ins.fields
        if f["bank_id"] == WEIGHT_LOAD_BANK:
            return self._load_weights(ctx)
        ctx.check(f["bank_id"] in self.banks.mem, "bank_id", f"no such bank on {self.arch.target_label}")
        ctx.check(f["mode_avg"] == 0, "mode_avg", f"{self.arch.target_label} has no mean-value bank")
        reg = self._region(ctx)
        n, ch, jr = f["length"], f["channel"], f["jump_read"]
        idx = f["ddr_addr"] + np.arange(n)[:, None] * jr + np.arange(ch)[None, :]
        keep = self._load_pad_mask(ctx, self.banks.width[f["bank_id"]])
        inside = idx < reg.size
        # masked (padding) bytes are never read, so only the kept ones must lie in the region
        ctx.check(bool(np.all(inside | (keep is not None and ~keep))), "ddr_addr",
                  f"reads up to byte {int(idx.max()) + 1} of a {reg.size}-byte region")
        items = np.where(inside, reg[np.minimum(idx, reg.size - 1)], 0).astype(np.uint8)
        self._ddr(ctx, False, (f["reg_id"], f["ddr_addr"], n, ch, jr))
        if keep is not None:
            items = items * keep
        self.banks.write_many(f["bank_id"], f["bank_addr"] + np.arange(n) * f["jump_write"], items)
        self.stats.load_bytes += int(keep.sum()) if keep is not None else n * ch

    def _load_pad_mask(self, ctx: Ctx, width: int) -> np.ndarray | None:
        """Load<T>::gen_PadMask: channel-augmentation padding of overlapping items, or None when nothing is masked."""
        f = ctx.ins.fields
        n, ch, jr = f["length"], f["channel"], f["jump_read"]
        if not jr <= ch <= PAD_MASK_CHANNEL_LIMIT:
            return None
        items, byte = np.arange(n)[:, None], np.arange(ch)[None, :]
        lead = np.maximum(0, f["pad_start"] - items * jr)
        ctx.check(bool(np.all(lead < ch)), "pad_start", f"leading pad count must be < channel={ch}")
        first_tail = n - f["pad_idx"]
        start = -(-ch // width) * width - (f["pad_end"] + jr * (items - first_tail))
        tail = items >= first_tail
        ctx.check(bool(np.all(start[tail] > 0)), "pad_end", "tail pad start index must be > 0")
        mask = (byte < lead) | (tail & (byte >= start))
        return ~mask if mask.any() else None

    def _load_weights(self, ctx: Ctx) -> None:
        """bank_id 0x3F: output channel oc < OCP/2 from (reg_id, ddr_addr), the others from (reg_id_1, ddr_addr_1),
        at (oc mod OCP/2) * jump_read_endl + item * jump_read, into the CONV weight bank oc."""
        f = ctx.ins.fields
        conv = self._engine(ctx, "conv")
        ocp, half = self.arch.ocp, self.arch.ocp // 2
        ctx.check(f["output_channel_num"] <= ocp, "output_channel_num", f"more than OCP={ocp} output channels")
        ports = ((self._region(ctx, "reg_id"), f["ddr_addr"]), (self._region(ctx, "reg_id_1"), f["ddr_addr_1"]))
        n, ch = f["length"], f["channel"]
        for oc in range(f["output_channel_num"]):
            reg, base = ports[oc >= half]
            start = base + (oc % half) * f["jump_read_endl"]
            end = start + (n - 1) * f["jump_read"] + ch
            ctx.check(end <= reg.size, "ddr_addr" if oc < half else "ddr_addr_1",
                      f"output channel {oc} reads up to byte {end} of a {reg.size}-byte region")
            bank = self.banks.group_bank(conv.weight_bank, oc)
            src = reg[start + np.arange(n)[:, None] * f["jump_read"] + np.arange(ch)]
            self._ddr(ctx, False, (f["reg_id_1"] if oc >= half else f["reg_id"], start, n, ch, f["jump_read"]))
            self.banks.write_many(bank, f["bank_addr"] + np.arange(n) * f["jump_write"], src)
            self.stats.load_bytes += n * ch

    def _save(self, ctx: Ctx) -> None:
        f = ctx.ins.fields
        bank = self._image_bank(ctx, "bank_id")
        reg = self._region(ctx)
        n, ch, jw = f["length"], f["channel"], f["jump_write"]
        end = f["ddr_addr"] + (n - 1) * jw + ch
        ctx.check(end <= reg.size, "ddr_addr", f"writes up to byte {end} of a {reg.size}-byte region")
        data = self.banks.read_many(bank, f["bank_addr"] + np.arange(n) * f["jump_read"], ch)
        self._ddr(ctx, True, (f["reg_id"], f["ddr_addr"], n, ch, jw))
        if jw >= ch or n == 1:  # items do not overlap in DDR
            reg[f["ddr_addr"] + np.arange(n)[:, None] * jw + np.arange(ch)] = data
        else:  # overlapping items: in order, the later one wins
            for i in range(n):
                reg[f["ddr_addr"] + i * jw:f["ddr_addr"] + i * jw + ch] = data[i]
        self.stats.save_bytes += n * ch

    # ---- window engines: CONV, POOL, DPTWISE -------------------------------------------------------------------
    def _window(self, ctx: Ctx, *, height: int, width: int, nbytes: int, stride_h: int, offset_in: int,
                endl: int, jump: int, real: tuple[slice, slice] | None = None) -> np.ndarray:
        """The (height, width, nbytes) int8 input rows of a window engine by the row-fetch rule (bank wrap at the
        CONV's PP, base address slot per wrap). An access record (`record_accesses`) gets only the `real` rows and
        columns (those the padding does not replace: the hardware never fetches a padded pixel)."""
        f = ctx.ins.fields
        bank_in = self._image_bank(ctx, "bank_id_in")
        ctx.check(offset_in < stride_h, None, f"stride_offset_in={offset_in} must be < stride_h={stride_h}")
        bases = tuple(f[k] for k in ("bank_addr_in", "bank_addr_in_1", "bank_addr_in_2", "bank_addr_in_3"))
        rm = fetch_rows(bank_in, self.arch.pp, height, stride_h, offset_in, endl, bases)
        ctx.check(int(rm.groups.max(initial=0)) < ADDR_GROUPS, None,
                  f"the input rows need {int(rm.groups.max()) + 1} base addresses, the instruction has {ADDR_GROUPS}")
        out = np.empty((height, width, nbytes), np.uint8)
        cols = np.arange(width) * jump
        trace, self.banks.trace = self.banks.trace, None
        try:
            for h in range(height):
                out[h] = self.banks.read_many(int(rm.banks[h]), int(rm.rows[h]) + cols, nbytes)
        finally:
            self.banks.trace = trace
        if trace is not None:
            rows, keep = (real if real is not None else (slice(None), slice(None)))
            for h in range(height)[rows]:
                self.banks._note(int(rm.banks[h]), int(rm.rows[h]) + cols[keep], nbytes, False)
        return out.view(np.int8)

    def _store(self, ctx: Ctx, result: np.ndarray, *, stride_out: int, offset_out: int, endl: int, jump: int) -> None:
        """Write result (rows, width, bytes) by the row-store rule (bank wrap at the CONV's PP)."""
        bank_out = self._image_bank(ctx, "bank_id_out")
        banks, rows = store_rows(bank_out, self.arch.pp, result.shape[0], stride_out, offset_out, endl,
                                 ctx.ins.fields["bank_addr_out"])
        cols = np.arange(result.shape[1]) * jump
        for r in range(result.shape[0]):
            self.banks.write_many(int(banks[r]), int(rows[r]) + cols, result[r])

    @staticmethod
    def _real(f: dict, h: int, w: int, kh: int, kw: int) -> tuple[slice, slice]:
        """The window rows and columns Conv/Pool/DptWise::pad leaves: left/top counts, right/bottom as 'last valid
        index'."""
        return (slice(f["pad_top"], max(0, h - kh + f["pad_bottom"] + 1)),
                slice(f["pad_left"], max(0, w - kw + f["pad_right"] + 1)))

    @classmethod
    def _pad(cls, x: np.ndarray, f: dict, kh: int, kw: int, value: int) -> None:
        """Conv/Pool/DptWise::pad on the real input rows (`_real`): the rest becomes `value`."""
        rows, cols = cls._real(f, x.shape[0], x.shape[1], kh, kw)
        x[:, :cols.start] = value
        x[:rows.start] = value
        x[:, cols.stop:] = value
        x[rows.stop:] = value

    def _padded_window(self, ctx: Ctx, g: dict, cin: int, endl: int, pad_value: int) -> np.ndarray:
        """The padded input window of a CONV / POOL / DPTWISE under its INIT's fields `g`: (vpp - 1) * sh + kh rows
        of (length - 1) * sw + kw pixels of `cin` bytes (`endl`: the jump_read_endl the engine reads, the INIT's or
        the instruction's)."""
        f = ctx.ins.fields
        kh, kw, sh, sw, vpp = g["kernel_h"], g["kernel_w"], g["stride_h"], g["stride_w"], g["valid_pixel_parallel"]
        height, width = (vpp - 1) * sh + kh, (f["length"] - 1) * sw + kw
        x = self._window(ctx, height=height, width=width, nbytes=cin, stride_h=sh, offset_in=g["stride_offset_in"],
                         endl=endl, jump=g["jump_read"], real=self._real(f, height, width, kh, kw))
        self._pad(x, f, kh, kw, pad_value)
        return x

    def _bias_and_round(self, ctx: Ctx, acc: np.ndarray, bias: np.ndarray, init: Instr) -> np.ndarray:
        """Conv::bias + transform: 2 * acc + floor(bias * 2**(shift_bias + 1)), then act and DPURound of
        / 2**(shift_cut + 1)."""
        g = init.fields
        sb = g["shift_bias"]
        ctx.check(sb <= SHIFT_BIAS_MAX or sb >= SHIFT_BIAS_NEGATIVE, None,
                  f"{init.name} shift_bias={sb} is neither <= {SHIFT_BIAS_MAX} nor a negative shift (>= 32)")
        e = shift_bias_exponent(sb) + 1
        b = bias.astype(np.int64)
        b = b << e if e >= 0 else b >> -e  # an arithmetic right shift is the floor
        return activate(acc * 2 + b, g["shift_cut"] + 1, g["act_type"])

    def _conv(self, ctx: Ctx) -> None:
        f = ctx.ins.fields
        init = self._init_of(ctx, "CONVINIT")
        g = init.fields
        conv = self._engine(ctx, "conv")
        self._check_act(ctx, g["act_type"], self.arch.conv_activations, "conv")
        kh, kw, sh, sw, vpp = g["kernel_h"], g["kernel_w"], g["stride_h"], g["stride_w"], g["valid_pixel_parallel"]
        ctx.check(vpp <= self.arch.pp, None, f"CONVINIT valid_pixel_parallel={vpp} > PP={self.arch.pp}")
        cg = f["channel_group"]
        cin = cg * self.arch.icp
        x = self._padded_window(ctx, g, cin, g["jump_read_endl"], 0)
        x[..., cin - f["channel_offset"]:] = 0
        taps = f["bank_addr_weights"] + np.arange(kh * kw) * cg  # tap (j, k) at (j * kw + k) * cg rows
        wts = np.stack([self.banks.read_many(self.banks.group_bank(conv.weight_bank, oc), taps, cin)
                        for oc in range(self.arch.ocp)]).reshape(self.arch.ocp, kh, kw, cin)
        bias = self.banks.read(self.banks.group_bank(conv.bias_bank, 0), f["bank_addr_bias"], self.arch.ocp)
        win = sliding_window_view(x.astype(np.float32), (kh, kw), axis=(0, 1))[::sh, ::sw]  # (vpp, L, cin, kh, kw)
        rows = win.reshape(-1, cin * kh * kw)
        w = wts.view(np.int8).astype(np.float32).transpose(0, 3, 1, 2).reshape(self.arch.ocp, -1)
        acc = exact_matmul_t(rows, w).reshape(win.shape[0], win.shape[1], self.arch.ocp)  # exact int64
        out = self._bias_and_round(ctx, acc, bias.view(np.int8), init)
        self._store(ctx, out, stride_out=g["stride_out"], offset_out=g["stride_offset_out"],
                    endl=g["jump_write_endl"], jump=g["jump_write"])

    def _pool(self, ctx: Ctx) -> None:
        f = ctx.ins.fields
        g = self._init_of(ctx, "POOLINIT").fields
        pool = self._engine(ctx, "pool")
        kind = g["pool_type"]
        ctx.check(kind in (POOL["maxpool"], POOL["avgpool"]), None,
                  f"POOLINIT pool_type={kind}: {self.arch.target_label} pools by max (0) or average (1)")
        kh, kw, sh, sw, vpp = g["kernel_h"], g["kernel_w"], g["stride_h"], g["stride_w"], g["valid_pixel_parallel"]
        ctx.check(vpp <= pool.pp, None, f"POOLINIT valid_pixel_parallel={vpp} > the pool engine's PP={pool.pp}")
        cin = f["channel_group"] * pool.cp
        is_max = kind == POOL["maxpool"]
        x = self._padded_window(ctx, g, cin, f["jump_read_endl"], INT8_MIN if is_max else 0)
        win = sliding_window_view(x, (kh, kw), axis=(0, 1))[::sh, ::sw]  # (vpp, L, cin, kh, kw)
        if is_max:
            v = win.max(axis=(-2, -1)).astype(np.float64)
        else:
            v = self._avg(win, kh, kw).astype(np.float64)
        sc = g["shift_cut"]
        v = v * 2.0 ** scale_exponent(sc)  # a power of two: exact in float64
        self._store(ctx, dpu_round(v), stride_out=g["stride_out"], offset_out=g["stride_offset_out"],
                    endl=f["jump_write_endl"], jump=g["jump_write"])

    @staticmethod
    def _avg(win: np.ndarray, kh: int, kw: int) -> np.ndarray:
        """Pool<T>::pool_one's average: a float32 sum, scaled by kernel_w's table entry, stored back in float32."""
        total = win.astype(np.float32).sum(axis=(-2, -1), dtype=np.float32)  # integers < 2**24: exact
        if kw in AVG_TABLE_WIDTHS:
            num, shift = avgpool_factor(kw, kw)
            return (total.astype(np.float64) * (num / (1 << shift))).astype(np.float32)
        return (total.astype(np.float64) / float(kh * kw)).astype(np.float32)

    def _dptwise(self, ctx: Ctx) -> None:
        f = ctx.ins.fields
        init = self._init_of(ctx, "DWINIT")
        g = init.fields
        dw = self._engine(ctx, "dwconv")
        self._check_act(ctx, g["act_type"], self.arch.alu_activations, "depthwise")
        kh, kw, sh, sw, vpp = g["kernel_h"], g["kernel_w"], g["stride_h"], g["stride_w"], g["valid_pixel_parallel"]
        ctx.check(vpp <= dw.pp, None, f"DWINIT valid_pixel_parallel={vpp} > the depthwise engine's PP={dw.pp}")
        cg = f["channel_group"]
        cin = cg * dw.cp
        x = self._padded_window(ctx, g, cin, g["jump_read_endl"], 0)
        x[..., cin - f["channel_offset"]:] = 0
        wbank = self.banks.group_bank(dw.weight_bank, 0)
        rows_per_pixel = cg * (dw.cp // self.banks.width[wbank])
        taps = f["bank_addr_weights"] + np.arange(kh * kw) * rows_per_pixel
        wts = self.banks.read_many(wbank, taps, cin).reshape(kh, kw, cin).view(np.int8)
        bias = self.banks.read(self.banks.group_bank(dw.bias_bank, 0), f["bank_addr_bias"], cin).view(np.int8)
        win = sliding_window_view(x.astype(np.int64), (kh, kw), axis=(0, 1))[::sh, ::sw]
        acc = np.einsum("hwcij,ijc->hwc", win, wts.astype(np.int64))
        out = self._bias_and_round(ctx, acc, bias, init)
        self._store(ctx, out, stride_out=g["stride_out"], offset_out=g["stride_offset_out"],
                    endl=g["jump_write_endl"], jump=g["jump_write"])

    # ---- ELEW ------------------------------------------------------------------------------------------------
    def _elewinit(self, ctx: Ctx) -> None:
        self.elew_fifo.append(ctx.ins)

    def _elew_bank(self, bank_id: int, k: int) -> tuple[int, int]:
        """Pixel k of a row starting at bank_id: its bank (wrapping in the CONV's PP group) and the wrap count."""
        pp = self.arch.pp
        base = bank_id - bank_id % pp
        return base + (bank_id + k) % pp, (bank_id % pp + k) // pp

    def _elew(self, ctx: Ctx) -> None:
        f = ctx.ins.fields
        elew = self._engine(ctx, "elew")
        num, vpp, length = f["num"], f["valid_pixel_parallel"], f["length"]
        ctx.check(len(self.elew_fifo) >= num, "num", f"only {len(self.elew_fifo)} ELEWINIT before this ELEW")
        ctx.check(vpp <= elew.pp, "valid_pixel_parallel", f"> the eltwise engine's PP={elew.pp}")
        self._check_act(ctx, f["act_type"], self.arch.elew_activations, "eltwise")
        inits, self.elew_fifo = self.elew_fifo[:num], self.elew_fifo[num:]
        cin = f["channel_group"] * elew.cp
        total = np.zeros((vpp, length, cin), np.int64)
        for i, ins in enumerate(inits):
            g = ins.fields
            ctx.check(g["id"] == i, None, f"input {i} comes from an ELEWINIT with id={g['id']}")
            ctx.check(g["bank_id_in"] in self.banks.image_ids, None, f"ELEWINIT bank_id_in={g['bank_id_in']} is "
                                                                     f"not an image bank")
            x = np.empty((vpp, length, cin), np.uint8)
            for k in range(vpp):
                bank, wrap = self._elew_bank(g["bank_id_in"], k)
                base = g["bank_addr_in"] + wrap * g["jump_read_endl"]
                x[k] = self.banks.read_many(bank, base + np.arange(length) * g["jump_read"], cin)
            total += (x.view(np.int8).astype(np.int64) << ELEW_SCALE_BITS) >> g["shift_read"]
        sw = f["shift_write"]
        e = scale_exponent(sw)
        out = activate(total, ELEW_SCALE_BITS - e, f["act_type"])
        bank_out = self._image_bank(ctx, "bank_id_out")
        for k in range(vpp):
            bank, wrap = self._elew_bank(bank_out, k)
            base = f["bank_addr_out"] + wrap * f["jump_write_endl"]
            self.banks.write_many(bank, base + np.arange(length) * f["jump_write"], out[k])


class DpuV3EDevice:
    """A DPUV3E core for the xmodel runner and `compare` (the `execute(sg, regions)` interface of
    runtime.device.EmulatorDevice). Each call runs on a fresh emulator (zeroed banks): vai_c's programs load all
    they read, and calls from several threads then share nothing."""

    name = "emulator"

    def __init__(self, arch: Arch):
        self.arch = arch
        self.last_stats: V3EStats | None = None

    def execute(self, sg, regions: dict[int, np.ndarray]) -> None:
        """Run `sg` over `regions` (modified in place); a region not given is zeroed, except a program's parameter
        region (a CompiledSubgraph's `params`), which is its parameter bytes."""
        full = dict(regions)
        for rid, size in sg.region_sizes.items():
            if rid not in full:
                full[rid] = np.zeros(size, np.uint8)
                params = getattr(sg, "params", None) if rid == REG_PARAMS else None
                if isinstance(params, np.ndarray):
                    full[rid][:params.size] = params.view(np.uint8).reshape(-1)
        self.last_stats = DpuV3EEmulator(self.arch).run(sg.code, full)
