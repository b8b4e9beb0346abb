"""Bit-exact functional emulator of DPUCZDX8G ISA1 machine code (docs/isa1-emulator.md, isa1-semantics.md).

It executes instructions strictly in program order and ignores dpdon/dpdby, like AMD's `sim-runner` (the source of
the conformance vectors). Each instruction is one vectorised numpy step (engine modules ddr, conv, alu,
elew). Every bank id, DDR access and field combination the simulator checks is checked here, with an
EmulatorError naming the instruction index, the instruction and the field.

A program has no branches, so everything but the data is known before it runs: `run` first compiles the code into
a list of steps (checks done, bank/DDR index arrays and strided views precomputed) and caches it per code, region
sizes and INIT state, so running the same program again (one inference per image) only moves and multiplies data.
A check that fails while compiling becomes a step raising the error at that instruction, so earlier instructions
still execute first, as in a plain interpreter.
"""
from __future__ import annotations

import gc
import math
import hashlib
import time
from collections import Counter, OrderedDict
from dataclasses import dataclass, field, replace
from typing import Callable, Collection, Mapping

import numpy as np

from tvm_dpu.arch.arch import Arch
from tvm_dpu.codegen.isa import Instr, enum_code, iter_program
from tvm_dpu.errors import EmulatorError, ISAError
from tvm_dpu.emulator import alu as emu_alu, conv as emu_conv, ddr as emu_ddr, elew as emu_elew
from tvm_dpu.emulator.context import NUM_REGIONS, Ctx, EmuStats, Step  # noqa: F401 (NUM_REGIONS re-exported)
from tvm_dpu.emulator.banks import Banks
from tvm_dpu.emulator.threads import DEFAULT_BLAS_THREADS, blas_threads  # noqa: F401 (re-exported)
from tvm_dpu.timing.depcheck import Access


#: Compiled programs kept per Emulator, counted in instructions (least recently used dropped first; the newest is
#: always kept). A compiled ResNet-50 (13k instructions) holds about 35 MB of index arrays.
PROGRAM_CACHE_INSTRUCTIONS = 100_000


@dataclass
class Program:
    """A compiled instruction stream: one step per executed instruction plus its static statistics."""

    steps: list[Step]
    names: list[str]  # instruction name per step
    convinit: tuple | None  # the CONVINIT in force before the program, when a CONV depends on it
    uses_convinit: bool
    static: list[tuple[int, int, int]]  # (load_bytes, save_bytes, macs) per step
    skipped_after_end: int
    #: What `run` executes: each step that does something, with the number of instructions it performs (a
    #: batched or merged step stands for the `_skip` steps after it).
    plan: list[tuple[Step, int]] = field(default_factory=list)
    _complete: EmuStats | None = None  # the statistics of a complete run, once counted

    def __post_init__(self) -> None:
        for step in self.steps:
            if step is _skip and self.plan:
                self.plan[-1] = (self.plan[-1][0], self.plan[-1][1] + 1)
            else:
                self.plan.append((step, 1))

    def stats(self, executed: int) -> EmuStats:
        """Statistics of the first `executed` steps (all of them after a complete run)."""
        if executed == len(self.steps):
            # A complete run (the usual case) counts what every complete run counts: summed once (13k
            # instructions take ~7 ms to count), copied per run.
            if self._complete is None:
                self._complete = self._count(executed)
            return replace(self._complete, counts=Counter(self._complete.counts))
        return self._count(executed)

    def _count(self, executed: int) -> EmuStats:
        st = EmuStats(counts=Counter(self.names[:executed]))
        for lb, sb, macs in self.static[:executed]:
            st.load_bytes += lb
            st.save_bytes += sb
            st.macs += macs
        st.ended = "END" in st.counts
        if executed == len(self.steps):
            st.skipped_after_end = self.skipped_after_end
        return st


class Emulator:
    """Functional model of one DPU core: banks, the INIT registers, and the eight DDR regions.

    Bank contents persist across `run` calls (call `reset()` to clear them); banks start zeroed.
    `stop_at_end=True` (default) stops at the first END as the hardware does; False executes every instruction
    as AMD's simulator does (END is then a no-op).
    """

    def __init__(self, arch: Arch, stop_at_end: bool = True):
        self.arch = arch
        self.stop_at_end = stop_at_end
        self.banks = Banks(arch)
        self.regions: dict[int, np.ndarray] = {}
        self.convinit: Instr | None = None
        self.aluinit: Instr | None = None
        self.elew_fifo: list[Instr] = []
        self.stats = EmuStats()
        #: The regions of the current `run` its caller promised are constant (`run`'s `constant`).
        self.constant: frozenset[int] = frozenset()
        self._programs: OrderedDict[tuple, Program] = OrderedDict()
        self._acts: dict[str, frozenset[int]] = {}
        self._scratch: dict[str, np.ndarray] = {}
        self._scratch_views: dict[tuple, np.ndarray] = {}
        #: One Access per instruction while `record_accesses` compiles and runs a program; None otherwise.
        self._accesses: list[Access] | None = None

    def scratch(self, name: str, shape: tuple[int, ...], dtype: np.dtype | type) -> np.ndarray:
        """A work array of this emulator, shared by every step asking for `name` (contents undefined). Steps run
        one at a time on the thread that owns the emulator, so one buffer per name serves them all; it grows to
        the largest request. The views handed out are cached (a step asks for the same ones every run)."""
        key = (name, shape, dtype)
        view = self._scratch_views.get(key)
        if view is not None:
            return view
        dtype = np.dtype(dtype)
        nbytes = math.prod(shape) * dtype.itemsize
        buf = self._scratch.get(name)
        if buf is None or buf.size < nbytes:
            buf = self._scratch[name] = np.empty(nbytes, np.uint8)
            self._scratch_views = {k: v for k, v in self._scratch_views.items() if k[0] != name}
        view = self._scratch_views[key] = buf[:nbytes].view(dtype).reshape(shape)
        return view

    def reset(self) -> None:
        """Clear banks and INIT state."""
        self.banks.reset()
        self.convinit = None
        self.aluinit = None
        self.elew_fifo = []

    # ---- activation white-lists -------------------------------------------------------------
    def allowed_acts(self, engine: str) -> frozenset[int]:
        """act_type codes the target allows on engine 'conv', 'alu' or 'elew'."""
        codes = self._acts.get(engine)
        if codes is None:
            codes = self._acts[engine] = frozenset(self._allowed_acts(engine))
        return codes

    def _allowed_acts(self, engine: str) -> set[int]:
        a = self.arch
        names, leaky_flag = {
            "conv": (a.conv_activations, a.conv_leaky),
            "alu": (a.alu_activations, a.dw_leaky),
            "elew": (a.elew_activations, False),
        }[engine]
        # Leaky is gated by the fingerprint flag (CV_LKRL / DW_LKRL), the other codes by the name lists.
        # A name the ISA does not know is an ISAError here, not a code silently left out.
        codes = {enum_code("act_type", "none")} | {enum_code("act_type", n) for n in names if n != "leaky_relu"}
        if leaky_flag:
            codes.add(enum_code("act_type", "leaky_relu"))
        return codes

    # ---- checks shared by engines ------------------------------------------------------------
    def check_image_bank(self, ctx: Ctx, field_name: str) -> int:
        b = int(ctx.ins.fields[field_name])
        if b not in self.banks.image_ids:
            raise ctx.error(field_name, f"not an image bank of {self.arch.name} ({self.banks.describe_image()})")
        return b

    def region(self, ctx: Ctx) -> np.ndarray:
        rid = int(ctx.ins.fields["reg_id"])
        reg = self.regions.get(rid)
        if reg is None:
            raise ctx.error("reg_id", f"DDR region {rid} is not defined (defined: {sorted(self.regions)})")
        return reg

    # ---- main loop ---------------------------------------------------------------------------
    def run(self, code: np.ndarray, regions: Mapping[int, np.ndarray], constant: Collection[int] = ()) -> EmuStats:
        """Execute machine code (uint32 words) against DDR `regions` {reg_id: uint8 array}, modified in place.

        The first run of a program compiles it (see the module docstring); later runs with regions of the same
        sizes reuse the compiled steps. `stats.seconds` includes the compile when there was one.

        `constant`: ids of regions whose array the caller promises nobody changes for as long as it passes that
        same array (a device's own read-only copy of a program's parameters). A CONV whose weights all come from
        LOADs of such a region in this run then skips comparing them with the weights it prepared on an earlier
        run from the same array (`emu_conv.ConvBatch.weights`); any other array is compared as always."""
        t0 = time.perf_counter()
        self.regions = self._checked_regions(regions)
        self.constant = frozenset(int(rid) for rid in constant)
        program = self._program(self._checked_code(code))
        stats = self.stats = EmuStats()  # ALU steps add their MACs here while running
        done = 0
        try:
            with blas_threads():
                for step, count in program.plan:
                    step(self.regions)
                    done += count
        finally:
            static = program.stats(done)
            static.macs += stats.macs
            static.seconds = time.perf_counter() - t0
            self.stats = static
        return static

    def record_accesses(self, code: np.ndarray, regions: Mapping[int, np.ndarray]) -> list[Access]:
        """Run `code` like `run` and return, per instruction executed, the bank rows and DDR bytes it read and
        wrote (timing.depcheck.Access; the dependency checker's race detection). The program is compiled afresh
        and not cached; `run` records nothing."""
        self.regions = self._checked_regions(regions)
        self.constant = frozenset()
        code = self._checked_code(code)
        self._accesses = []
        try:
            program = self._compile(code)
            accesses = self._accesses
        finally:
            self._accesses = None
            self.banks.trace = None
        self.stats = EmuStats()
        with blas_threads():
            for step, _ in program.plan:
                step(self.regions)
        return accesses

    def prepare(self, code: np.ndarray, regions: Mapping[int, np.ndarray]) -> None:
        """Compile `code` for DDR regions of these sizes and cache it, so the first `run` does not pay for it.
        Errors of the program itself surface when it runs."""
        self.regions = self._checked_regions(regions)
        self._program(self._checked_code(code))

    @staticmethod
    def _checked_code(code: np.ndarray) -> np.ndarray:
        code = np.asarray(code)
        if code.dtype != np.uint32:
            raise EmulatorError(f"code must be a uint32 array, got {code.dtype}")
        return code

    @staticmethod
    def _checked_regions(regions: Mapping[int, np.ndarray]) -> dict[int, np.ndarray]:
        out = {}
        for rid, arr in regions.items():
            if not 0 <= int(rid) < NUM_REGIONS:
                raise EmulatorError(f"DDR region id {rid} outside 0..{NUM_REGIONS - 1}")
            if not isinstance(arr, np.ndarray) or arr.dtype != np.uint8 or arr.ndim != 1:
                raise EmulatorError(f"DDR region {rid} must be a 1-D uint8 numpy array")
            out[int(rid)] = arr
        return out

    def _program(self, code: np.ndarray) -> Program:
        """The compiled program for `code` against the current region sizes and CONVINIT state (cached)."""
        key = (hashlib.blake2b(np.ascontiguousarray(code).tobytes(), digest_size=16).digest(), code.size,
               tuple(sorted((rid, reg.size) for rid, reg in self.regions.items())), self.stop_at_end)
        program = self._programs.get(key)
        if program is not None and program.uses_convinit and program.convinit != _init_key(self.convinit):
            program = None
        if program is None:
            # Compiling allocates ~10 small objects per instruction and frees none: skip the cyclic GC's scans.
            gc_was_enabled = gc.isenabled()
            gc.disable()
            try:
                program = self._compile(code)
            finally:
                if gc_was_enabled:
                    gc.enable()
            self._programs[key] = program
            total = sum(len(p.steps) for p in self._programs.values())
            while len(self._programs) > 1 and total > PROGRAM_CACHE_INSTRUCTIONS:
                total -= len(self._programs.popitem(last=False)[1].steps)
        self._programs.move_to_end(key)
        return program

    def _compile(self, code: np.ndarray) -> Program:
        try:
            decoded = [ins for _, ins in iter_program(code)]
        except ISAError as e:
            raise EmulatorError(f"cannot decode program: {e}") from None
        planner = _Planner(self)
        steps: list[Step] = []
        names: list[str] = []
        static: list[tuple[int, int, int]] = []
        skipped = 0
        saved_stats = self.stats
        try:
            for index, ins in enumerate(decoded):
                ctx = Ctx(index, ins, self.arch)
                self.stats = scratch = EmuStats()
                if self._accesses is not None:
                    self.banks.trace = _record(self._accesses, ins)
                try:
                    step = planner.plan(ctx)
                except EmulatorError as e:
                    steps.append(_raise_step(e))
                    names.append(ins.name)
                    static.append((0, 0, 0))
                    break
                if self._accesses is not None:
                    step = _recorded(self, self._accesses[-1], step)
                steps.append(step)
                names.append(ins.name)
                static.append((scratch.load_bytes, scratch.save_bytes, scratch.macs))
                if ins.name == "END" and self.stop_at_end:
                    skipped = len(decoded) - index - 1
                    break
        finally:
            self.stats = saved_stats
            self.banks.trace = None
        _mark_loaded_params(steps, names, self.banks)
        # CONVs first: grouping them looks at the bank rows of the LOADs between them, which merging drops.
        return Program(emu_ddr.merge_transfers(_batch_conv_runs(steps, names), _skip), names, _init_key(self.convinit),
                       planner.uses_initial, static, skipped)

    # ---- instructions that only change state --------------------------------------------------
    def _convinit(self, ctx: Ctx) -> None:
        self.convinit = ctx.ins

    def _aluinit(self, ctx: Ctx) -> None:
        self.aluinit = ctx.ins

    def _elewinit(self, ctx: Ctx) -> None:
        self.elew_fifo.append(ctx.ins)

    def _end(self, ctx: Ctx) -> None:
        pass

    def _isa0_only(self, ctx: Ctx) -> None:
        engine = "pool_engine" if ctx.ins.name.startswith("POOL") else "dwconv_engine"
        raise ctx.error(None, f"{self.arch.name} (ISA1) has no {engine}; use ALUINIT/ALU "
                              f"(isa1-semantics.md 0, 12.10)")


class _Planner:
    """Plans one program's instructions in order for `Emulator._compile`, following the INIT state the program
    sets up: the CONVINIT in force (a CONV before the program's first CONVINIT depends on the state the program
    starts in: `uses_initial`), the ELEWINIT FIFO and the last ALUINIT. Instructions without a planner become
    interpreted steps."""

    def __init__(self, emu: Emulator) -> None:
        self.emu = emu
        self.convinit = emu.convinit
        self.uses_initial = False
        # The ELEWINIT FIFO as the program leaves it, assuming it starts as it is now: an ELEW whose operands were
        # all pushed by this program is planned ahead; at run time it checks that the FIFO's front holds exactly
        # those ELEWINITs (else, e.g. entries left by an earlier program, it is interpreted).
        self.fifo: list[Instr | None] = [None] * len(emu.elew_fifo)  # None: pushed before this program
        self.aluinit: Instr | None = None  # the program's last ALUINIT so far
        self.planners = {"LOAD": emu_ddr.plan_load, "SAVE": emu_ddr.plan_save, "CONV": self.plan_conv,
                         "ELEW": self.plan_elew, "ALU": self.plan_alu}

    def plan(self, ctx: Ctx) -> Step:
        ins = ctx.ins
        plan = self.planners.get(ins.name)
        if plan is not None:
            return plan(self.emu, ctx)
        if ins.name == "CONVINIT":
            self.convinit = ins
        elif ins.name == "ELEWINIT":
            self.fifo.append(ins)
        elif ins.name == "ALUINIT":
            self.aluinit = ins
        return _interpreted_step(self.emu, _RUNNERS[ins.name], ctx)

    def plan_conv(self, emu: Emulator, ctx: Ctx) -> Step:
        if self.convinit is emu.convinit:
            self.uses_initial = True
        return emu_conv.plan_conv(emu, ctx, self.convinit)

    def plan_elew(self, emu: Emulator, ctx: Ctx) -> Step:
        num = int(ctx.ins.fields["num"])
        interpreted = _interpreted_step(emu, emu_elew.elew, ctx)
        inits = self.fifo[:num]
        del self.fifo[:num]
        if len(inits) < num or any(i is None for i in inits):
            return interpreted
        try:
            fast = emu_elew.plan_elew(emu, ctx, inits)
        except EmulatorError:
            return interpreted  # raises (with the same message) when it runs

        def step(regions: Mapping[int, np.ndarray]) -> None:
            front = emu.elew_fifo[:num]
            if len(front) == num and all(a is b for a, b in zip(front, inits)):
                fast()
            else:
                interpreted(regions)
        return step

    def plan_alu(self, emu: Emulator, ctx: Ctx) -> Step:
        # An ALU before the program's first ALUINIT reads the state the program starts in: interpreted.
        if self.aluinit is None:
            return _interpreted_step(emu, emu_alu.alu, ctx)
        return emu_alu.plan_alu(emu, ctx, self.aluinit)


#: What executes an instruction that has no planner, at run time.
_RUNNERS: dict[str, Callable[[Emulator, Ctx], None]] = {
    "ALU": emu_alu.alu, "ELEW": emu_elew.elew, "END": Emulator._end,
    "CONVINIT": Emulator._convinit, "ALUINIT": Emulator._aluinit, "ELEWINIT": Emulator._elewinit,
    "POOLINIT": Emulator._isa0_only, "POOL": Emulator._isa0_only,
    "DWINIT": Emulator._isa0_only, "DPTWISE": Emulator._isa0_only}


def _record(accesses: list[Access], ins: Instr) -> Access:
    """A new access record for `ins`, with the DDR bytes a SAVE writes (a LOAD's DDR bytes are recorded by
    emu_ddr.plan_load, which knows its mask; the bank side is recorded by Banks while the instruction is planned
    or run)."""
    acc = Access()
    f = ins.fields
    if ins.name == "SAVE":
        width = 1 if f["argmax"] & 2 and not f["const_en"] else f["channel"]
        acc.ddr_writes.append((f["reg_id"], f["ddr_addr"], f["length"], width, f["jump_write"]))
    accesses.append(acc)
    return acc


def _recorded(emu: Emulator, acc: Access, step: Step) -> Step:
    """`step` with what planning did not see recorded: a CONV's weights, bias and output rows and a plain
    LOAD's bank rows (both made into readers and writers only later), and whatever an interpreted step (ALU,
    INIT) touches when it runs."""
    if isinstance(step, emu_conv.ConvStep):
        acc.bank_reads.append(step.param_reads)
        acc.bank_writes.append(step.writes)
        return step
    if isinstance(step, emu_ddr.Transfer):
        (acc.bank_reads if step.save else acc.bank_writes).append(step.keys.reshape(-1))
        return step

    def run(regions: Mapping[int, np.ndarray]) -> None:
        emu.banks.trace = acc
        try:
            step(regions)
        finally:
            emu.banks.trace = None
    return run


def _init_key(ins: Instr | None) -> tuple | None:
    return None if ins is None else (ins.name, tuple(ins.fields.items()))


def _skip(regions: Mapping[int, np.ndarray]) -> None:
    """A CONV computed by the batched step of its run (it still counts as executed)."""


def _mark_loaded_params(steps: list[Step], names: list[str], banks: Banks) -> None:
    """Set `const_rid` of each CONV whose weight and bias rows were all last written, earlier in the program, by
    plain LOADs from one DDR region (that region's id; else None): they are then fixed by that region's bytes, as
    the program is straight-line and its LOADs read fixed addresses. Only LOADs write the CONVW and BIAS banks
    (CONV, ALU and ELEW outputs must be image banks: check_image_bank); a LOAD this pass cannot follow (masked,
    constant) forgets every row."""
    source = np.full(banks.rows.shape[0], -1, np.int16)  # per bank row: the region its last LOAD read, or -1
    for step, name in zip(steps, names):
        if isinstance(step, emu_ddr.Transfer):
            if not step.save:
                source[step.keys.reshape(-1)] = step.rid
        elif name == "LOAD":
            source[:] = -1
        elif isinstance(step, emu_conv.ConvStep):
            rows = source[step.param_reads]
            rid = int(rows[0]) if rows.size else -1
            step.const_rid = rid if rid >= 0 and bool(np.all(rows == rid)) else None


def _batch_conv_runs(steps: list[Step], names: list[str]) -> list[Step]:
    """`steps` with each group of CONVs that read the same window (a conv layer's output-channel groups) replaced
    by one step computing them all (emu_conv.batch_conv_run) at the place of the group's last CONV, the others
    becoming no-op steps. A group's CONVs are adjacent or separated only by instructions that running the earlier
    CONVs later cannot change (see `_conv_group`: vai_c loads each output group's weights right before its CONV and
    interleaves ALUs of another layer); and emu_conv.can_batch finds nothing one CONV of the group writes and
    another reads. The results, the statistics and the instruction an error names stay those of executing
    the CONVs one by one."""
    out = list(steps)
    i = 0
    while i < len(out):
        if not isinstance(out[i], emu_conv.ConvStep):
            i += 1
            continue
        members = _conv_group(out, names, i)
        run = [out[k] for k in members]
        if len(run) > 1 and emu_conv.can_batch(run):
            for k in members[:-1]:
                out[k] = _skip
            out[members[-1]] = emu_conv.batch_conv_run(run)
        else:
            out[i] = emu_conv.batch_conv_run(run[:1])
        i += 1
    for step in steps:  # the bank keys were only needed for the hazard checks
        if isinstance(step, emu_conv.ConvStep):
            step.reads = step.param_reads = step.writes = _NO_KEYS
    return out


def _conv_group(steps: list[Step], names: list[str], i: int) -> list[int]:
    """Indices of the CONVs from steps[i] on that may run together at the place of the last (`_batch_conv_runs`):
    same window and CONVINIT, with only these between them: plain LOADs writing no bank row the CONVs before them
    read or write, plain SAVEs reading no row those CONVs write, planned ALUs doing neither, and INITs (a planned
    CONV carries its CONVINIT; ALUINIT and ELEWINIT touch no bank)."""
    first = steps[i]
    members = [i]
    touched = np.sort(np.concatenate([first.reads, first.param_reads, first.writes]))
    written = np.sort(first.writes)
    for j in range(i + 1, len(steps)):
        step = steps[j]
        if isinstance(step, emu_conv.ConvStep):
            if step.window_id != first.window_id or step.init_id != first.init_id:
                break
            members.append(j)
            touched = np.sort(np.concatenate([touched, step.param_reads, step.writes]))
            written = np.sort(np.concatenate([written, step.writes]))
        elif isinstance(step, emu_ddr.Transfer):
            if _hits(written if step.save else touched, step.keys):  # a plain SAVE reads its rows, a LOAD writes
                break
        elif isinstance(step, emu_alu.AluStep):
            if _hits(touched, step.writes) or _hits(written, step.reads):
                break
        elif names[j] not in ("CONVINIT", "ALUINIT", "ELEWINIT"):
            break
    return members


def _hits(sorted_keys: np.ndarray, keys: np.ndarray) -> bool:
    """Whether any of `keys` is in the sorted array `sorted_keys`."""
    keys = keys.reshape(-1)
    at = np.searchsorted(sorted_keys, keys)
    return bool(np.any(sorted_keys[np.minimum(at, sorted_keys.size - 1)] == keys)) if sorted_keys.size else False


_NO_KEYS = np.zeros(0, np.int64)


def _interpreted_step(emu: Emulator, handler: Callable[[Emulator, Ctx], None], ctx: Ctx) -> Step:
    """An instruction interpreted when it runs: INIT/END (state changes), ISA0-only (errors), and an ALU or ELEW
    whose INIT state (ALUINIT, the ELEWINIT FIFO) is the one the program starts in."""
    return lambda regions: handler(emu, ctx)


def _raise_step(error: EmulatorError) -> Step:
    """The instruction whose checks failed while compiling: raises when execution reaches it."""
    def fail(regions: Mapping[int, np.ndarray]) -> None:
        raise error
    return fail
