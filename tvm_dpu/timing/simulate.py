"""Event-driven simulation of the four DPU engines replaying the dpdon/dpdby token discipline.

Model (docs/timing-model.md):

* Engines LOAD, SAVE, CONV, MISC each execute their own instructions in program order (isa1-semantics.md 10).
* An instruction starts when its engine is idle, its words have been fetched (one 32-bit word per cycle through
  the instruction port, prefetched ahead) and one token from each engine of its `dpdon` mask is available.
  Tokens are counted per engine pair (timing/depcheck.py, docs/dependency-protocol.md): own-engine counters start
  with one token, as vai_c's programs require (every engine's first instruction waits on its own engine).
* When it completes it posts one token to each engine of its `dpdby` mask. At the end every counter must be back
  at its start value (posts balance waits), else TimingError names the pair and the instruction that posted last. Compute instructions complete when
  their cycles are done; LOAD/SAVE free their engine when the last beat has moved and complete `ddr_latency` later.
* LOAD and SAVE share the core's AXI beat rate (2 ports, capped by the DDR share): max-min fair, each also capped
  by its own bank-side rate (cost.py).
* A program whose remaining instructions can never get their tokens raises TimingError naming them.
"""
from __future__ import annotations

import dataclasses
import hashlib
import heapq
import math
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Sequence

import numpy as np

from tvm_dpu.arch import load_arch
from tvm_dpu.arch.arch import Arch
from tvm_dpu.codegen.isa import DEFAULT_ISA, InstrSpec, decode, instr_specs
from tvm_dpu.timing.cost import ENGINES, CostModel, InstrCost
from tvm_dpu.timing.cost_dpuv3e import V3ECostModel
from tvm_dpu.timing.depcheck import OWN_CREDIT, initial_tokens, pair_name
from tvm_dpu.timing.params import MachineModel, TimingError, TimingParams, machine

_LOAD, _SAVE = 0, 1
_EPS = 1e-9


@dataclass
class OpTiming:
    """Timing of one op (an `op_ranges` entry).

    Engines run ahead of each other, so the instructions of consecutive ops overlap: `span` is the op's first start
    to last completion, `cycles` the op's contribution to the total, i.e. how far its last completion lies beyond
    the last completion of all earlier ops (the per-op cycles sum to the program's cycles, minus the END)."""

    name: str
    first: int
    end: int
    start_cycle: float
    end_cycle: float
    cycles: float
    busy: dict[str, float]
    macs: int
    ddr_read: int
    ddr_write: int

    @property
    def span(self) -> float:
        return max(0.0, self.end_cycle - self.start_cycle)


@dataclass
class TimingResult:
    """Outcome of `simulate`. Cycles are DPU core clock cycles; `start`/`end` per instruction (end = engine free),
    `done` = completion (tokens posted)."""

    arch: str
    freq_hz: float
    cycles: float
    engine_busy: dict[str, float]
    ddr_read_bytes: int
    ddr_write_bytes: int
    macs: int
    peak_ops_per_s: float
    names: list[str] = field(default_factory=list)
    engine_of: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int8))
    start: np.ndarray = field(default_factory=lambda: np.zeros(0))
    end: np.ndarray = field(default_factory=lambda: np.zeros(0))
    done: np.ndarray = field(default_factory=lambda: np.zeros(0))
    ops: list[OpTiming] = field(default_factory=list)
    model_ops: float | None = None  # real network ops (2*MACs) if the caller knows them, else None
    ddr_bus_bytes: float = 0.0  # bytes the DDR moves: AXI beats of every LOAD/SAVE incl. burst overheads

    @property
    def latency_s(self) -> float:
        return self.cycles / self.freq_hz

    @property
    def utilisation(self) -> dict[str, float]:
        """Busy fraction of each engine over the whole run."""
        return {e: (b / self.cycles if self.cycles else 0.0) for e, b in self.engine_busy.items()}

    @property
    def total_ops(self) -> float:
        """2 x MACs: the network's real ops when given (model_ops), else those of the CONV/dwconv instructions
        (counting computed output-channel padding)."""
        return self.model_ops if self.model_ops is not None else 2.0 * self.macs

    @property
    def gops(self) -> float:
        return self.total_ops / self.latency_s / 1e9 if self.cycles else 0.0

    @property
    def peak_utilisation(self) -> float:
        """Achieved ops/s over the core's peak PP*ICP*OCP*2*f."""
        return self.gops * 1e9 / self.peak_ops_per_s if self.cycles else 0.0

    def summary(self) -> dict[str, Any]:
        """JSON-ready totals (no per-instruction arrays)."""
        return {"arch": self.arch, "freq_mhz": self.freq_hz / 1e6, "cycles": self.cycles,
                "latency_ms": self.latency_s * 1e3, "gops": self.gops, "peak_utilisation": self.peak_utilisation,
                "engine_busy_cycles": dict(self.engine_busy), "engine_utilisation": self.utilisation,
                "ddr_read_bytes": self.ddr_read_bytes, "ddr_write_bytes": self.ddr_write_bytes,
                "macs": self.macs, "instructions": len(self.names)}


#: InstrCosts per machine model, by what `CostModel.cost` reads of an instruction: its opcode and TIMED_FIELDS bits
#: (and those of the CONVINIT / ALUINIT in force for a CONV / ALU). The compiler simulates programs that differ in
#: a few ops (fusion fallback, conv variants, candidates) and repeated blocks at other addresses, so most
#: instructions are costed without being decoded. Bounded; guarded for threads.
_COST_CACHE: "OrderedDict[MachineModel, dict]" = OrderedDict()
_COST_CACHE_MAX = 1 << 17
_COST_LOCK = threading.Lock()


def _cost_cache(m: MachineModel) -> dict:
    with _COST_LOCK:
        cache = _COST_CACHE.get(m)
        if cache is None or len(cache) > _COST_CACHE_MAX:
            cache = _COST_CACHE[m] = {}
            while len(_COST_CACHE) > 4:
                _COST_CACHE.popitem(last=False)
        return cache


#: The cost model of each instruction set, by its name.
COST_MODELS: dict[str, type[CostModel]] = {c.ISA: c for c in (CostModel, V3ECostModel)}


def cost_model_class(isa: str) -> type[CostModel]:
    """The cost model of instruction set `isa` (TimingError for one without formulas)."""
    cls = COST_MODELS.get(isa)
    if cls is None:
        raise TimingError(f"no cost formulas for instruction set {isa} (known: {', '.join(COST_MODELS)})")
    return cls


def _layout(words: list[int], isa: str) -> tuple[list[int], list[InstrSpec]]:
    """Word offset and layout of every instruction of a stream; ISAError (as decoding raises it) at the first word
    that does not start a whole instruction."""
    by_opcode = _specs_by_opcode(isa)
    pos, n = 0, len(words)
    offsets: list[int] = []
    specs: list[InstrSpec] = []
    while pos < n:
        spec = by_opcode.get(words[pos] >> 28)
        if spec is None or pos + spec.words > n:
            decode(words, pos, isa)  # raises, naming the word
        offsets.append(pos)
        specs.append(spec)
        pos += spec.words
    return offsets, specs


def _costs(code: Any, m: MachineModel) -> tuple[list[str], list[int], list[int], list[InstrCost], list[float]]:
    arr = np.ascontiguousarray(np.asarray(code, dtype=np.uint32)).ravel()
    words = arr.tolist()
    isa = m.arch.instruction_set
    cls = cost_model_class(isa)
    offsets, specs = _layout(words, isa)
    masks: list[int] = []
    for spec in specs:
        masks.extend(_COST_MASKS.get((isa, spec.opcode)) or _cost_masks(spec.opcode, isa))
    timed = (arr & np.asarray(masks, dtype=np.uint32)).tolist()
    cm = cls(m)
    init_of, init_attr = cls.INITS, cls.INIT_ATTR
    cache = _cost_cache(m)
    names, dpdon, dpdby, costs, fetch = [], [], [], [], []
    per_word = m.fetch_cycles_per_word
    inits: dict[str, tuple] = {}  # "CONV" / "ALU" / ... -> (offset, timed words) of the INIT in force
    for i, (pos, spec) in enumerate(zip(offsets, specs)):
        name = spec.name
        end = pos + spec.words
        w0 = words[pos]
        names.append(name)
        dpdon.append(w0 >> 24 & 0xF)
        dpdby.append(w0 >> 20 & 0xF)
        key: tuple = tuple(timed[pos:end])
        attr = init_attr.get(name)
        init = None
        if attr is not None:
            init = inits.get(name)
            key = (key, init[1] if init is not None else None)
        elif name in init_of:
            inits[init_of[name]] = (pos, key)
        c = cache.get(key)
        if c is None:
            if attr is not None:
                setattr(cm, attr, decode(words, init[0], isa)[0] if init is not None else None)
            c = cm.cost(i, decode(words, pos, isa)[0])
            cache[key] = c
        costs.append(c)
        fetch.append(end * per_word)
    return names, dpdon, dpdby, costs, fetch


@lru_cache(maxsize=None)
def _specs_by_opcode(isa: str = DEFAULT_ISA) -> dict[int, InstrSpec]:
    return {s.opcode: s for s in instr_specs(isa).values()}


def _cost_masks(opcode: int, isa: str) -> tuple[int, ...]:
    """`_timed_masks` without the dependency masks: the bits `CostModel.cost` reads."""
    m = _timed_masks(opcode, isa)
    out = _COST_MASKS[(isa, opcode)] = (m[0] & 0xF00FFFFF,) + m[1:]
    return out


_COST_MASKS: dict[tuple[str, int], tuple[int, ...]] = {}


#: Cycles of programs already simulated, by (program digest, arch, params): the compiler compares the same
#: programs several times (fusion fallback, conv variants, repeated blocks compiled alone), and a program's
#: cycles depend only on what `timing_key` keeps of its words, and the machine. Bounded; guarded for threads.
_CYCLES: "OrderedDict[tuple, float]" = OrderedDict()
_CYCLES_MAX = 1024
_CYCLES_LOCK = threading.Lock()


#: Per (instruction set, opcode), one mask per instruction word keeping the bits the timing model reads: opcode,
#: dpdon, dpdby and the cost model's TIMED_FIELDS (built on first use).
_TIMED_MASKS: dict[tuple[str, int], tuple[int, ...]] = {}


def _timed_masks(opcode: int, isa: str = DEFAULT_ISA) -> tuple[int, ...] | None:
    masks = _TIMED_MASKS.get((isa, opcode))
    if masks is None:
        spec = _specs_by_opcode(isa).get(opcode)
        if spec is None:
            return None
        out = [0] * spec.words
        out[0] = 0xFFF00000  # opcode, dpdon, dpdby
        timed = cost_model_class(isa).TIMED_FIELDS.get(spec.name, ())
        for f in spec.fields:
            if f.name in timed:
                out[f.word] |= ((1 << f.len) - 1) << f.pos
        masks = _TIMED_MASKS[(isa, opcode)] = tuple(out)
    return masks


def timing_key(code: Any, isa: str = DEFAULT_ISA) -> tuple[str, bytes]:
    """A digest of what the timing model reads of a program in instruction set `isa`: its words with every other
    bit cleared (addresses, shifts, activation types), so two programs with the same key have the same cycles on
    every machine of that instruction set. A stream that does not decode is keyed on all its words (simulating it
    raises)."""
    words = np.ascontiguousarray(np.asarray(code, dtype=np.uint32)).ravel()
    w = words.tolist()
    masks: list[int] = []
    pos, n = 0, len(w)
    while pos < n:
        m = _timed_masks(w[pos] >> 28, isa)
        if m is None or pos + len(m) > n:
            return "words", hashlib.sha256(words.tobytes()).digest()
        masks.extend(m)
        pos += len(m)
    return "timed", hashlib.sha256((words & np.asarray(masks, dtype=np.uint32)).tobytes()).digest()


def cycles(code: Any, arch: Arch | str, params: TimingParams | None = None) -> float:
    """`simulate(code, arch, params).cycles`, remembered per program as the timing model sees it (`timing_key`):
    what compile-time choices need."""
    a = load_arch(arch)
    words = np.ascontiguousarray(np.asarray(code, dtype=np.uint32))
    key = (timing_key(words, a.instruction_set), a, params)
    with _CYCLES_LOCK:
        hit = _CYCLES.get(key)
        if hit is not None:
            _CYCLES.move_to_end(key)
            return hit
    value = float(simulate(words, a, params).cycles)
    with _CYCLES_LOCK:
        _CYCLES[key] = value
        while len(_CYCLES) > _CYCLES_MAX:
            _CYCLES.popitem(last=False)
    return value


#: The engines a 4-bit dependency mask names, by mask (shared, never changed).
_MASK_ENGINES: tuple[tuple[int, ...], ...] = tuple(tuple(e for e in range(4) if mask >> e & 1) for mask in range(16))
#: By dpdon mask and the instruction's engine: the token counters (src * 4 + dst) it waits on; by dpdby mask and
#: engine: the counters it posts to.
_NEEDS = tuple(tuple(tuple(s * 4 + e for s in _MASK_ENGINES[mask]) for e in range(4)) for mask in range(16))
_POSTS = tuple(tuple(tuple(e * 4 + d for d in _MASK_ENGINES[mask]) for e in range(4)) for mask in range(16))


def _nested(tok: list[int]) -> list[list[int]]:
    """tokens[src][dst] from the flat counters."""
    return [tok[s * 4:s * 4 + 4] for s in range(4)]


class _Engines:
    """The four engines' state while `simulate` replays one program: queues, running instructions, tokens, DMA
    rates and the heap of completions still to post. One `step` is one event: start what can start, advance to
    the next event, finish what ends there, post what completes. The steps bind attributes to locals because
    the fusion search simulates thousands of candidate programs."""

    def __init__(self, costs: list[InstrCost], fetch: list[float], dpdon: list[int], dpdby: list[int],
                 m: MachineModel) -> None:
        n = len(costs)
        self.n = n
        self.fetch = fetch
        self.cyc = [c.cycles for c in costs]
        self.beats = [c.beats for c in costs]
        self.latency = [c.latency for c in costs]
        self.engine = [c.engine for c in costs]
        self.queues: list[list[int]] = [[] for _ in ENGINES]
        for i, e in enumerate(self.engine):
            self.queues[e].append(i)
        self.qlen = [len(q) for q in self.queues]
        self.head = [0] * 4
        self.running: list[int | None] = [None] * 4
        self.free_at = [0.0] * 4  # compute engines: when the running instruction ends
        self.remaining = [0.0] * 4  # DMA engines: beats left
        self.min_end = [0.0] * 4  # DMA engines: earliest end (issue + bank side)
        self.rate = [0.0] * 4
        # token counters tok[src * 4 + dst]: an instruction takes from `needs` (its dpdon, on its own engine) and
        # posts to `posts_to` (its dpdby, from its own engine)
        self.tok = [v for row in initial_tokens() for v in row]
        self.poster = [-1] * 16  # per counter, the instruction that posted last
        self.wants_token = [False] * 4  # the engine's next instruction lacks a token: only a post can change that
        self.posts: list[tuple[float, int]] = []  # heap of (time, instruction) completions to post
        nan = float("nan")
        self.start, self.end, self.done = [nan] * n, [nan] * n, [nan] * n
        self.needs = [_NEEDS[on][e] for on, e in zip(dpdon, self.engine)]
        self.posts_to = [_POSTS[by][e] for by, e in zip(dpdby, self.engine)]
        self.is_dma = [b > 0 for b in self.beats]
        # dma_own_token "transfer_end": a LOAD/SAVE posts its own engine's token when its last beat has moved (its
        # DDR latency then delays only the tokens to other engines); early_own marks those already posted
        self.own_early = m.params.dma_own_token == "transfer_end"
        self.early_own = [False] * n
        self.busy = [0.0] * 4
        self.capacity = m.dma_beats_per_cycle
        ports = float(m.params.axi_data_ports)
        # the bank side caps each instruction's beat rate, and so do its ports: the shared data ports, or ports of its
        # own (own_ports: a weight LOAD through the weight ports, which leaves the data ports to the other engine)
        self.own_port = [c.own_ports > 0 for c in costs]
        self.own_cap = [min(c.beats / max(c.cycles, _EPS), c.own_ports or ports) if c.beats > 0 else 0.0
                        for c in costs]
        self.t = 0.0
        self.finished = 0
        # the lists each step reads, bundled: one attribute load and an unpack per event instead of one per list
        self._for_start = (self.running, self.wants_token, self.head, self.qlen, self.queues, self.fetch, self.needs,
                           self.tok, self.cyc, self.start, self.min_end, self.is_dma, self.remaining, self.beats,
                           self.free_at)
        self._for_next = (self.running, self.head, self.qlen, self.queues, self.fetch, self.is_dma, self.remaining,
                          self.rate, self.min_end, self.free_at, self.posts)
        self._for_complete = (self.running, self.remaining, self.rate, self.beats, self.is_dma, self.posts, self.tok,
                              self.poster, self.wants_token, self.posts_to, self.min_end, self.free_at, self.end,
                              self.busy, self.start, self.latency, self.done, self.engine, self.early_own)

    def rerate(self) -> None:
        """Max-min fair split of the AXI capacity between the two DMA engines, each capped by its own rate (the
        smaller cap first; on a tie LOAD)."""
        running, remaining, rate, own_cap, capacity = self.running, self.remaining, self.rate, self.own_cap, \
            self.capacity
        il, is_ = running[_LOAD], running[_SAVE]
        load_on = il is not None and remaining[_LOAD] > 0.0
        save_on = is_ is not None and remaining[_SAVE] > 0.0
        if load_on and self.own_port[il] or save_on and self.own_port[is_]:
            return self._rerate_own_ports(load_on, save_on)
        if load_on and save_on:
            cl, cs = own_cap[il], own_cap[is_]
            first, second, c1, c2 = (_SAVE, _LOAD, cs, cl) if cs < cl else (_LOAD, _SAVE, cl, cs)
            r1 = min(c1, capacity / 2)
            rate[first] = r1
            rate[second] = min(c2, (capacity - r1) / 1)
        elif load_on:
            rate[_LOAD], rate[_SAVE] = min(own_cap[il], capacity / 1), 0.0
        elif save_on:
            rate[_LOAD], rate[_SAVE] = 0.0, min(own_cap[is_], capacity / 1)
        else:
            rate[_LOAD] = rate[_SAVE] = 0.0

    def _rerate_own_ports(self, load_on: bool, save_on: bool) -> None:
        """`rerate` when a running transfer has ports of its own: it moves at its own cap, the other engine's transfer
        has the whole shared capacity."""
        running, rate, own_cap = self.running, self.rate, self.own_cap
        for e, on in ((_LOAD, load_on), (_SAVE, save_on)):
            i = running[e]
            rate[e] = 0.0 if not on else own_cap[i] if self.own_port[i] else min(own_cap[i], self.capacity)

    def start_ready(self) -> None:
        """Start every instruction that can start at t (engine idle, words fetched, tokens there)."""
        t = self.t
        t_eps = t + _EPS
        (running, wants_token, head, qlen, queues, fetch, needs, tok, cyc, start, min_end, is_dma, remaining, beats,
         free_at) = self._for_start
        started = False
        for e in range(4):
            if running[e] is not None or wants_token[e] or head[e] >= qlen[e]:
                continue
            i = queues[e][head[e]]
            if fetch[i] > t_eps:
                continue
            need = needs[i]
            if need:
                blocked = False
                for k in need:
                    if tok[k] <= 0:
                        blocked = True
                        break
                if blocked:
                    wants_token[e] = True
                    continue
                for k in need:
                    tok[k] -= 1
            head[e] += 1
            running[e] = i
            start[i] = t
            min_end[e] = t + cyc[i]
            if is_dma[i]:
                remaining[e] = beats[i]
                started = True
            else:
                remaining[e] = 0.0
                free_at[e] = t + cyc[i]
        if started:
            self.rerate()

    def next_event(self, names: list[str], dpdon: list[int]) -> float:
        """The time of the next event: an engine's instruction ending, a fetch completing or a post falling due.
        Raises TimingError when nothing can ever happen again (a deadlock)."""
        t = self.t
        t_eps = t + _EPS
        running, head, qlen, queues, fetch, is_dma, remaining, rate, min_end, free_at, posts = self._for_next
        t_next = math.inf
        waiting = False
        for e in range(4):
            i = running[e]
            if i is None:
                if head[e] < qlen[e]:
                    f = fetch[queues[e][head[e]]]
                    if f > t_eps:
                        waiting = True
                        if f < t_next:
                            t_next = f
                continue
            waiting = True
            if is_dma[i] and remaining[e] > 0.0:
                c = t + remaining[e] / rate[e] if rate[e] > 0 else math.inf
            else:
                c = min_end[e] if is_dma[i] else free_at[e]
                if c < t:
                    c = t
            if c < t_next:
                t_next = c
        if posts:
            waiting = True
            if posts[0][0] < t_next:
                t_next = posts[0][0]
        if not waiting:
            _deadlock(t, names, queues, head, dpdon, _nested(self.tok))
        if t_next == math.inf:
            raise TimingError("DMA engines have no bandwidth (check ddr_bytes_per_s / axi parameters)")
        return t_next

    def complete(self, t_next: float) -> None:
        """Move on to t_next: the DMA engines' beats advance, the engines whose work is over are freed (their
        completions post after their latency) and every completion due at t_next posts its tokens."""
        dt = t_next - self.t
        self.t = t = t_next
        t_eps = t + _EPS
        (running, remaining, rate, beats, is_dma, posts, tok, poster, wants_token, posts_to, min_end, free_at, end, busy,
         start, latency, done, engine, early_own) = self._for_complete
        changed = False
        for e in (_LOAD, _SAVE):
            i = running[e]
            if i is not None and remaining[e] > 0.0:
                remaining[e] = max(0.0, remaining[e] - rate[e] * dt)
                if remaining[e] <= 1e-6 * max(1.0, beats[i]):
                    remaining[e] = 0.0  # beats done: its share of the AXI rate goes to the other engine
                    changed = True
        for e in range(4):
            i = running[e]
            if i is None:
                continue
            if is_dma[i]:
                if remaining[e] > 0.0 or min_end[e] > t_eps:
                    continue
                changed = True
            elif free_at[e] > t_eps:
                continue
            end[i] = t
            busy[e] += t - start[i]
            running[e] = None
            if self.own_early and is_dma[i]:
                k = e * 5  # the own counter, e * 4 + e
                if k in posts_to[i]:
                    tok[k] += 1
                    poster[k] = i
                    wants_token[e] = False
                    early_own[i] = True
            heapq.heappush(posts, (t + latency[i], i))
        if changed:
            self.rerate()
        while posts and posts[0][0] <= t_eps:
            tp, i = heapq.heappop(posts)
            done[i] = tp
            self.finished += 1
            own = engine[i] * 5 if early_own[i] else -1  # counter e * 4 + e, posted at the transfer's end
            for k in posts_to[i]:
                if k == own:
                    continue
                tok[k] += 1
                poster[k] = i
                wants_token[k & 3] = False

    def run(self, names: list[str], dpdon: list[int]) -> None:
        start_ready, next_event, complete, n = self.start_ready, self.next_event, self.complete, self.n
        while self.finished < n:
            start_ready()
            complete(next_event(names, dpdon))


def simulate(code: Any, arch: Arch | str, params: TimingParams | None = None,
             op_ranges: Sequence[tuple[str, int, int]] | None = None, model_ops: float | None = None) -> TimingResult:
    """Simulate machine code `code` (uint32 words) on one core of `arch`.

    `op_ranges` [(op name, first instr, end instr)] (CompiledSubgraph.op_ranges) adds per-op timings; `model_ops`
    (the network's real 2*MACs) makes GOPS count real work instead of the instructions' padded MACs.
    Raises TimingError if the tokens deadlock (naming the blocked instructions) or an instruction has no formula.
    """
    a = load_arch(arch)
    replay, costs = _replay(code, a, params)
    result = dataclasses.replace(replay, ops=[], model_ops=model_ops)
    frontier = 0.0
    for name, lo, hi in op_ranges or ():
        ot = _op_timing(result, costs, name, lo, hi, frontier)
        frontier = max(frontier, ot.end_cycle)
        result.ops.append(ot)
    return result


#: The last whole programs `simulate` replayed (of at least REPLAY_MIN_INSTRS instructions), by their words, arch
#: and params: the compile simulates the program it keeps (choosing among plans and conv variants) and the timing
#: report of the same compile then simulates it again (ResNet-50: 15k instructions, about 0.1 s). A few entries, so
#: that the candidates compared after it do not evict it; guarded for threads.
_REPLAYS: "OrderedDict[tuple, tuple[TimingResult, list[InstrCost]]]" = OrderedDict()
_REPLAYS_MAX = 4
REPLAY_MIN_INSTRS = 1024


def _replay(code: Any, a: Arch, params: TimingParams | None) -> tuple[TimingResult, list[InstrCost]]:
    """The simulation of `code` on `a` (a result without op timings or model_ops, its arrays read-only: results
    share it) and the instructions' costs."""
    words = np.ascontiguousarray(np.asarray(code, dtype=np.uint32))
    key = (words.tobytes(), a, params)
    with _CYCLES_LOCK:
        hit = _REPLAYS.get(key)
        if hit is not None:
            _REPLAYS.move_to_end(key)
            return hit
    m = machine(a, params)
    names, dpdon, dpdby, costs, fetch = _costs(words, m)
    eng = _Engines(costs, fetch, dpdon, dpdby, m)
    eng.run(names, dpdon)
    _check_balance(_nested(eng.tok), {(k // 4, k % 4): i for k, i in enumerate(eng.poster) if i >= 0}, names, costs)
    start, end, done = np.array(eng.start), np.array(eng.end), np.array(eng.done)
    engine_of = np.array([c.engine for c in costs], dtype=np.int8)
    for arr in (start, end, done, engine_of):
        arr.flags.writeable = False
    total = float(np.nanmax(done)) if eng.n else 0.0
    result = TimingResult(arch=a.name, freq_hz=m.freq_hz, cycles=total,
                          engine_busy={ENGINES[e]: eng.busy[e] for e in range(4)},
                          ddr_read_bytes=sum(c.ddr_read for c in costs),
                          ddr_write_bytes=sum(c.ddr_write for c in costs), macs=sum(c.macs for c in costs),
                          peak_ops_per_s=m.peak_ops_per_s, names=names, engine_of=engine_of, start=start, end=end,
                          done=done, ddr_bus_bytes=sum(c.beats for c in costs) * m.axi_bytes)
    if len(costs) >= REPLAY_MIN_INSTRS:
        with _CYCLES_LOCK:
            _REPLAYS[key] = (result, costs)
            while len(_REPLAYS) > _REPLAYS_MAX:
                _REPLAYS.popitem(last=False)
    return result, costs


def _op_timing(r: TimingResult, costs: list[InstrCost], name: str, lo: int, hi: int, frontier: float) -> OpTiming:
    if not 0 <= lo <= hi <= len(costs):
        raise TimingError(f"op {name!r}: instruction range [{lo}, {hi}) outside the program ({len(costs)} instr)")
    busy = {e: 0.0 for e in ENGINES}
    for i in range(lo, hi):
        busy[ENGINES[costs[i].engine]] += float(r.end[i] - r.start[i])
    s = float(np.min(r.start[lo:hi])) if hi > lo else 0.0
    d = float(np.max(r.done[lo:hi])) if hi > lo else 0.0
    sub = costs[lo:hi]
    return OpTiming(name, lo, hi, s, d, max(0.0, d - frontier), busy, sum(c.macs for c in sub), sum(c.ddr_read for c in sub),
                    sum(c.ddr_write for c in sub))


def _deadlock(t: float, names: list[str], queues: list[list[int]], head: list[int], dpdon: list[int],
              tokens: list[list[int]]) -> None:
    blocked = []
    for e in range(4):
        if head[e] < len(queues[e]):
            i = queues[e][head[e]]
            missing = [ENGINES[s] for s in range(4) if dpdon[i] >> s & 1 and tokens[s][e] <= 0]
            blocked.append(f"instruction {i} ({names[i]}, engine {ENGINES[e]}) waits for a token from "
                           f"{', '.join(missing) or '?'} that is never posted")
    raise TimingError(f"deadlock at cycle {t:.0f}: " + "; ".join(blocked))


def _check_balance(tokens: list[list[int]], last_post: dict, names: list[str], costs: list[InstrCost]) -> None:
    for s in range(4):
        for d in range(4):
            left = tokens[s][d] - (OWN_CREDIT if s == d else 0)
            if left > 0:
                i = last_post[(s, d)]
                raise TimingError(f"unbalanced tokens: {left} token(s) {pair_name(s, d)} left over at the end (last "
                                  f"posted by instruction {i} ({names[i]}, engine {ENGINES[costs[i].engine]}))")
            if left < 0:
                raise TimingError(f"unbalanced tokens: own counter {pair_name(s, d)} ends {-left} token(s) below "
                                  f"its initial {OWN_CREDIT}: the next program's first {ENGINES[s]} instruction "
                                  f"would wait forever")


def simulate_subgraph(sg: Any, arch: Arch | str | None = None, params: TimingParams | None = None,
                      model_ops: float | None = None) -> TimingResult:
    """Simulate a `CompiledSubgraph` (its code and op_ranges) on `arch` (default: the arch it was compiled for)."""
    return simulate(sg.code, arch if arch is not None else sg.arch, params, sg.op_ranges, model_ops)


@dataclass
class ModelTiming:
    """`runtime.model_timing.simulate_model` result: one TimingResult per DPU subgraph, run back to back on one
    core. CPU parts of the model (pre/post-processing, ops left on the CPU) are NOT included."""

    subgraphs: dict[str, TimingResult]

    @property
    def cycles(self) -> float:
        return sum(r.cycles for r in self.subgraphs.values())

    @property
    def latency_s(self) -> float:
        return sum(r.latency_s for r in self.subgraphs.values())

    @property
    def total_ops(self) -> float:
        return sum(r.total_ops for r in self.subgraphs.values())

    @property
    def gops(self) -> float:
        return self.total_ops / self.latency_s / 1e9 if self.latency_s else 0.0

    @property
    def peak_utilisation(self) -> float:
        rs = list(self.subgraphs.values())
        return self.gops * 1e9 / rs[0].peak_ops_per_s if rs and self.latency_s else 0.0

    @property
    def ddr_bytes(self) -> int:
        return sum(r.ddr_read_bytes + r.ddr_write_bytes for r in self.subgraphs.values())

    def summary(self) -> dict[str, Any]:
        return {"latency_ms": self.latency_s * 1e3, "cycles": self.cycles, "gops": self.gops,
                "peak_utilisation": self.peak_utilisation, "ddr_bytes": self.ddr_bytes,
                "cpu_time_included": False,
                "subgraphs": {k: r.summary() for k, r in self.subgraphs.items()}}
