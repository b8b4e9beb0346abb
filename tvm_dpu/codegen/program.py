"""Instruction stream builder: program order, INIT de-duplication and engine dependency tokens.

Every emitted instruction declares the abstract resources it reads and writes (an on-chip buffer, a DDR tensor).
The builder derives the dependencies from them (read-after-write, write-after-read, write-after-write) and turns
each cross-engine dependency into a dpdon/dpdby token pair, following the protocol of vai_c's own programs
(docs/dependency-protocol.md, timing/depcheck.py):

* an instruction's `dpdby` mask posts one token to each named engine when it finishes, its `dpdon` mask waits for
  (and takes) one token from each named engine before it starts; tokens are counted per engine pair;
* every instruction names its own engine in both masks, as vai_c's do: an engine's counter to itself starts with
  one token, so each instruction waits for the previous one of its engine to complete and passes the token on;
* posts balance waits on every pair, so END (waiting on and posting to SAVE, like vai_c's) leaves the counters as
  the program found them.

Engines complete their own instructions in order (the own tokens make sure of it), so a dependency on
instruction j of engine A also covers all earlier A instructions, and anything j itself waited for. The builder
keeps, per instruction, the newest instruction of each engine known complete before it starts (a vector clock
over the token chains), posts only from the instruction a waiter needs and skips waits a chain already covers.
The timing model replays exactly these tokens, so the flags are the schedule."""
from __future__ import annotations

import bisect
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Iterable

import numpy as np

from tvm_dpu.codegen.isa import DEFAULT_ISA, ENGINE_BITS, Instr, encode_program, instr_spec, make_encoded

ENGINES = ("load", "save", "conv", "misc")
_ENGINE_INDEX = {e: i for i, e in enumerate(ENGINES)}
_NO_CLOCK = (-1,) * len(ENGINES)

#: Parameter buffers split into two slots (halves) that successive ops alternate between (Program.next_slot); a
#: resource named without a slot, e.g. ("convw",), means the whole buffer, i.e. every slot.
SLOTTED = {"convw": 2, "bias": 2}


def _expand(resources: Iterable) -> tuple:
    out = []
    for r in resources:
        if r and isinstance(r[0], tuple):
            # A group of resources where one is expected (conv.py passes a tile's `in_res` group to loaders that
            # take one resource): each of them. Kept as one key, the group matched no reader, so the CONVs of
            # such tiles did not wait for their input LOADs (a race the dependency checker found).
            out.extend(_expand(r))
        elif len(r) == 1 and r[0] in SLOTTED:
            out.extend((r[0], k) for k in range(SLOTTED[r[0]]))
        elif len(r) == 2 and r[0] in SLOTTED and isinstance(r[1], str):
            # a tagged part (e.g. ("convw", "b"), one member's rows of a fused kernel) in every slot: it conflicts
            # with whole slots but not with the other tags
            out.extend((r[0], k, r[1]) for k in range(SLOTTED[r[0]]))
        else:
            out.append(r)
    return tuple(out)


#: _expand of the resource tuples instructions name, by the tuple: a program names the same few thousand over and
#: over (bounded; a resource that cannot be hashed is expanded each time)
_EXPANDED: dict[tuple, tuple] = {}
_EXPANDED_MAX = 1 << 16


def _expand_cached(resources: Iterable) -> tuple:
    key = resources if isinstance(resources, tuple) else tuple(resources)
    try:
        hit = _EXPANDED.get(key)
    except TypeError:
        return _expand(key)
    if hit is None:
        if len(_EXPANDED) >= _EXPANDED_MAX:
            _EXPANDED.clear()
        hit = _EXPANDED[key] = _expand(key)
    return hit


def _prefixes_of(r: tuple) -> tuple:
    return tuple(r[:n] for n in range(1, len(r)))


#: Bytes of a DDR tensor tracked as one resource by LOAD / SAVE (the AXI 4 KiB boundary).
DDR_BLOCK = 4096
_DMA_DDR = ("LOAD", "SAVE")


def _ddr_blocks(resources: tuple, fields: dict, jump: str, block: int = DDR_BLOCK) -> tuple:
    """`resources` with each whole-tensor ("ddr", name) of a LOAD / SAVE narrowed to the `block`-sized blocks of
    the bytes it moves (ddr_addr to ddr_addr + (length-1)*jump + channel, isa1-semantics 4): a consumer's first
    LOADs then wait only for the SAVEs of the rows they read, not for the whole map, so consecutive ops overlap.
    A ("ddr", name) named by any other instruction still covers every block (a prefix conflicts with its parts)."""
    if "ddr_addr" not in fields:
        return resources
    lo = fields["ddr_addr"]
    hi = lo + max(0, fields.get("length", 1) - 1) * fields.get(jump, 0) + fields.get("channel", 1)
    key = (resources, block, lo // block, (hi - 1) // block)
    try:
        hit = _BLOCKS.get(key)
    except TypeError:
        hit, key = None, None
    if hit is None:
        out = []
        for r in resources:
            if len(r) == 2 and r[0] == "ddr" and r[1] != "params":
                out.extend(("ddr", r[1], b) for b in range(lo // block, (hi - 1) // block + 1))
            else:
                out.append(r)
        hit = tuple(out)
        if key is not None:
            if len(_BLOCKS) >= _EXPANDED_MAX:
                _BLOCKS.clear()
            _BLOCKS[key] = hit
    return hit


#: _ddr_blocks by (resources, first block, last block): LOADs and SAVEs of a tile row repeat their blocks (bounded)
_BLOCKS: dict[tuple, tuple] = {}


#: INIT instructions configure the op that follows; an identical INIT already in force is not re-emitted.
_INITS = {"CONVINIT": "conv", "ALUINIT": "alu", "POOLINIT": "pool", "DWINIT": "dw"}


@dataclass(slots=True)
class _Entry:
    instr: Instr
    engine: str
    reads: tuple = ()
    writes: tuple = ()
    comment: str = ""
    #: the instruction's words with dpdon = dpdby = 0 (isa.make_encoded; None: a field is out of range)
    words: tuple[int, ...] | None = None


#: engine (category) of each (instruction set, instruction name), filled on first use
_CATEGORY: dict[tuple[str, str], str] = {}


def _category(name: str, isa: str = DEFAULT_ISA) -> str:
    engine = _CATEGORY.get((isa, name))
    if engine is None:
        engine = _CATEGORY[isa, name] = instr_spec(name, isa).category
    return engine


@dataclass
class Program:
    """An instruction stream under construction."""

    entries: list[_Entry] = field(default_factory=list)
    _last_writer: dict = field(default_factory=dict)  # resource -> index
    _readers: dict = field(default_factory=dict)  # resource -> [index] since the last write
    # (src engine, dst engine) -> highest src instruction index whose completion dst already waited for
    _covered: dict = field(default_factory=dict)
    _init_state: dict = field(default_factory=dict)
    _last_of_engine: dict = field(default_factory=dict)  # engine -> index of its latest instruction
    #: per instruction, the newest instruction index of each engine known complete before it starts (-1: none);
    #: tuples, which the garbage collector stops tracking (a program holds one per instruction)
    _clock: list = field(default_factory=list)
    _of_engine: dict = field(default_factory=lambda: {e: [] for e in ENGINES})  # engine -> its instruction indices
    _waits: dict = field(default_factory=dict)  # (src engine, dst engine) -> indices of the pair's waits, in order
    _last_post: dict = field(default_factory=dict)  # (src engine, dst engine) -> index of the pair's latest post
    _children: dict = field(default_factory=dict)  # resource name prefix -> the longer names used under it
    _prefixes: dict = field(default_factory=dict)  # resource name used -> its proper prefixes
    #: resource name used -> every name used that overlaps it: itself, its prefixes and the longer names under it
    #: (built on use, dropped when another such name is first used)
    _related: dict = field(default_factory=dict)
    _slots: dict = field(default_factory=dict)  # buffer name -> slot used last (see next_slot)
    _engine_of: list = field(default_factory=list)  # per instruction, the index of its engine in ENGINES
    #: DDR tensor name -> the tensor whose memory it is (a concat input saved into its slice of the concat's
    #: output): ("ddr", name) resources are tracked under the root, so a consumer of the concat waits for the
    #: SAVEs of every producer that wrote a slice.
    ddr_roots: dict = field(default_factory=dict)
    #: (first row, slot) while a fused kernel written for parameters from row 0 of the CONVW / BIAS banks is emitted
    #: into half `slot` of them instead (relocated_params): its parameter LOADs and the rows its CONVs / ALUs read
    #: move by `first row`, and its ("convw",) / ("bias",) resources become that half's.
    param_shift: tuple[int, int] | None = None
    #: False: a scratch program whose instructions are only looked at (compiler.relocated_params measures a
    #: kernel's parameter rows with one): no dependency tracking, no tokens
    track: bool = True
    #: the most tokens _depend lets a cross-engine counter hold along program order (CODEGEN_COUNTER_DEPTH in
    #: timing/depcheck.py bounds it): 1 unless an emitter asks for more (deeper_counters)
    counter_depth: int = 1
    #: the instruction set the program is written in (codegen.isa.ISA_FILES): DPUV2 (DPUCZDX8G ISA1) or DPUV3E
    isa: str = DEFAULT_ISA
    #: bytes of the DDR blocks a LOAD / SAVE's ("ddr", name) is narrowed to (_ddr_blocks): the dependency grain of
    #: a map in DDR
    ddr_block: int = DDR_BLOCK

    def __len__(self) -> int:
        return len(self.entries)

    def next_slot(self, buffer: str, slots: int = 2) -> int:
        """Round-robin slot of an on-chip buffer shared by successive ops (e.g. the halves of the CONVW banks), so
        the next op's parameters can load while this op still computes from the other slot."""
        slot = (self._slots.get(buffer, slots - 1) + 1) % slots
        self._slots[buffer] = slot
        return slot

    @contextmanager
    def deeper_counters(self, depth: int):
        """Within the block, let cross-engine counters hold up to `depth` tokens along program order (at least the
        depth in force), so a waiter can take its token from the instruction it needs although its pair's later
        waits come between them in program order (e.g. a pool pass waiting for the SAVEs of the pass before last,
        whose output slot it reuses, while the last pass's own wait comes between)."""
        was = self.counter_depth
        self.counter_depth = max(was, depth)
        try:
            yield self
        finally:
            self.counter_depth = was

    def emit(self, name: str, reads: Iterable = (), writes: Iterable = (), comment: str = "", **fields: int) -> int:
        """Append instruction `name` with `fields`; returns its index (or that of the identical INIT in force)."""
        init_key = _INITS.get(name)
        if init_key is not None and self._init_state.get(init_key) == fields:
            return self._init_state[init_key + "@"]
        if self.param_shift is not None:
            reads, writes, fields = self._shift_params(tuple(reads), tuple(writes), fields)
        instr, words = make_encoded(name, fields, self.isa)
        engine = _category(name, self.isa)
        entries = self.entries
        idx = len(entries)
        if not self.track:
            entries.append(_Entry(instr, engine, tuple(reads), tuple(writes), comment, words))
            return idx
        reads, writes = _expand_cached(reads), _expand_cached(writes)
        if self.ddr_roots:
            reads, writes = self._canonical(reads), self._canonical(writes)
        if name in _DMA_DDR:
            if name == "LOAD":
                reads = _ddr_blocks(reads, fields, "jump_read", self.ddr_block)
            else:
                writes = _ddr_blocks(writes, fields, "jump_write", self.ddr_block)
        # Per source engine, the newest instruction this one depends on (engines complete in order, so it covers
        # the older ones): the last writer of every resource that overlaps one this instruction names, and for a
        # write also the readers since that write. Overlapping: itself, its prefixes (a longer name is a part of
        # its prefix: ("vb0", 0, 3), bank 3 of the copy buffer, lies in ("vb0", 0)) and the longer names under it.
        # A name used for the first time is registered on the way (it has no writer or reader yet).
        last_writer, readers, related, engine_of = self._last_writer, self._readers, self._related, self._engine_of
        newest = [-1, -1, -1, -1]
        for r in (*reads, *writes):
            for k in related.get(r) or self._relate(r):
                d = last_writer.get(k)
                if d is not None:
                    e = engine_of[d]
                    if d > newest[e]:
                        newest[e] = d
        for r in writes:
            for k in related.get(r) or self._relate(r):
                ks = readers.get(k)
                if ks is not None:
                    newest = list(map(max, newest, ks))
        entries.append(_Entry(instr, engine, reads, writes, comment, words))
        me = _ENGINE_INDEX[engine]
        engine_of.append(me)
        own = ENGINE_BITS[engine]
        instr.dpdon |= own
        instr.dpdby |= own
        prev = self._last_of_engine.get(engine)
        self._clock.append(self._done_clock(prev) if prev is not None else _NO_CLOCK)
        newest[me] = -1  # in order within an engine
        deps = [d for d in newest if d >= 0]
        if deps:
            deps.sort(reverse=True)  # the newest first: its chain may cover the others
            for d in deps:
                self._depend(idx, d)
        self._last_of_engine[engine] = idx
        self._of_engine[engine].append(idx)
        for r in reads:
            ks = readers.get(r)
            if ks is None:
                ks = readers[r] = [-1, -1, -1, -1]
            ks[me] = idx
        children = self._children
        for w in writes:
            last_writer[w] = idx
            readers.pop(w, None)
            # a write over a whole resource orders its parts' earlier readers too (it waited for them): a later
            # writer of a part waits for this write, so their readers restart (else they grow with the program)
            for c in children.get(w, ()):
                readers.pop(c, None)
        if init_key is not None:
            self._init_state[init_key] = dict(fields)
            self._init_state[init_key + "@"] = idx
        return idx

    def _register(self, r: tuple) -> None:
        """Note a resource name used for the first time: its prefixes, and it as a longer name under each (whose
        overlapping names therefore grow, as do those of the names under it)."""
        pre = self._prefixes[r] = _prefixes_of(r)
        for q in pre:
            self._children.setdefault(q, []).append(r)
            self._related.pop(q, None)
        for c in self._children.get(r, ()):
            self._related.pop(c, None)

    def _relate(self, r: tuple) -> tuple:
        """The names used so far that overlap `r` (a name never used has no writer or reader to depend on),
        registering `r` if it is new."""
        prefixes = self._prefixes
        if r not in prefixes:
            self._register(r)
        rel = self._related[r] = (r, *(q for q in prefixes[r] if q in prefixes), *self._children.get(r, ()))
        return rel

    def _shift_params(self, reads: tuple, writes: tuple, fields: dict) -> tuple[tuple, tuple, dict]:
        """An instruction of a relocated fused kernel (param_shift): rows of whole-bank parameter resources move."""
        row, slot = self.param_shift
        fields = dict(fields)
        moved = lambda r, buf: r[0] == buf and (len(r) == 1 or len(r) == 2 and isinstance(r[1], str))
        for buf, key in (("convw", "bank_addr_weights"), ("bias", "bank_addr_bias")):
            if any(moved(r, buf) for r in writes) and "bank_addr" in fields:
                fields["bank_addr"] += row
            if any(moved(r, buf) for r in reads) and key in fields:
                fields[key] += row
        move = lambda rs: tuple((r[0], slot) + r[1:] if moved(r, "convw") or moved(r, "bias") else r for r in rs)
        return move(reads), move(writes), fields

    def _canonical(self, resources: tuple) -> tuple:
        if not self.ddr_roots:
            return resources
        return tuple(("ddr", self.ddr_roots.get(r[1], r[1])) + r[2:] if r[0] == "ddr" else r for r in resources)

    def _depend(self, idx: int, dep: int) -> None:
        src = self.entries[dep].engine
        dst = self.entries[idx].engine
        if src == dst:
            return  # in-order within an engine
        key = (src, dst)
        if self._covered.get(key, -1) >= dep or self._clock[idx][_ENGINE_INDEX[src]] >= dep:
            return
        # Post from `dep` itself, not from a later instruction of its engine: a later post would make the waiter
        # wait for work it does not need (e.g. the LOADs of tile t+1 for the CONVs of tile t instead of t-1,
        # which serialises the double buffer). Every earlier post of src to dst is at an index <= covered < dep,
        # so the posts reach dst in the order of its waits, and along program order the pair's counter then holds
        # one token more than before from `dep` on: 1 + the pair's waits after `dep` (all earlier posts lie
        # before `dep`, and posts equal waits). Where that would exceed `counter_depth` (the k-th latest wait
        # comes after `dep`), the post moves to src's first instruction at or after that wait, which keeps the
        # counter within the bound (CODEGEN_COUNTER_DEPTH in timing/depcheck.py).
        # When src has no instruction there, the pair's previous wait is made to wait for `dep` instead (its post
        # moves from the pair's last post to `dep`): `idx` comes after that wait on its engine, so it is covered
        # too, and a post moved later never deepens a counter.
        post = dep
        waits = self._waits.get(key)
        k = self.counter_depth
        if waits is not None and len(waits) >= k and waits[-k] > dep:
            later = self._of_engine[src]
            j = bisect.bisect_left(later, waits[-k])
            if j < len(later) and later[j] < idx:
                post = later[j]
            else:
                self.entries[self._last_post[key]].instr.dpdby &= ~ENGINE_BITS[dst]
                self.entries[dep].instr.dpdby |= ENGINE_BITS[dst]
                self._last_post[key] = self._covered[key] = dep
                done = self._done_clock(dep)
                for j in (waits[-1], idx):
                    self._clock[j] = tuple(map(max, self._clock[j], done))
                return
        self._last_post[key] = post
        self.entries[post].instr.dpdby |= ENGINE_BITS[dst]
        self.entries[idx].instr.dpdon |= ENGINE_BITS[src]
        self._covered[key] = post
        if waits is None:
            self._waits[key] = [idx]
        else:
            waits.append(idx)
        self._clock[idx] = tuple(map(max, self._clock[idx], self._done_clock(post)))

    def _done_clock(self, j: int) -> tuple[int, ...]:
        """What is known complete once instruction j completes: its start clock, itself and (in-order completion)
        every earlier instruction of its engine."""
        out = list(self._clock[j])
        out[self._engine_of[j]] = j
        return tuple(out)

    def end(self) -> None:
        """Append END (on SAVE: it waits for the last SAVE through the own token, and for any other engine whose
        last instruction no token chain already orders before it)."""
        before = dict(self._last_of_engine)
        idx = self.emit("END")
        for last in sorted(before.values(), reverse=True):
            self._depend(idx, last)

    @property
    def instrs(self) -> list[Instr]:
        return [e.instr for e in self.entries]

    def encode(self) -> np.ndarray:
        """The program's machine words (uint32): each instruction's words as built, with its masks set."""
        out: list[int] = []
        for e in self.entries:
            words, ins = e.words, e.instr
            on, by = ins.dpdon, ins.dpdby
            if words is None or on.__class__ is not int or by.__class__ is not int or not 0 <= on <= 15 \
                    or not 0 <= by <= 15:
                return encode_program(self.instrs, isa=self.isa)  # raises, naming the instruction and what is wrong
            out.append(words[0] | on << 24 | by << 20)
            out.extend(words[1:])
        return np.asarray(out, dtype=np.uint32)

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for e in self.entries:
            out[e.instr.name] = out.get(e.instr.name, 0) + 1
        return out
