"""Instruction stream builder: program order, INIT de-duplication and engine dependency tokens.

Every emitted instruction declares the abstract resources it reads and writes (an on-chip buffer, a DDR tensor).
The builder derives the dependencies from them (read-after-write, write-after-read, write-after-write) and turns
each cross-engine dependency into a dpdon/dpdby token pair (isa1-semantics.md 10; the hardware meaning is our
reading, the simulator ignores the flags):

* an instruction's `dpdby` mask posts one token to each named engine when it finishes;
* an instruction's `dpdon` mask waits for one token from each named engine before it starts;
* tokens between a pair of engines are consumed in order, so the k-th wait of engine B on engine A is satisfied
  by the k-th post of A to B.

Engines execute their own instructions in order, so a dependency on instruction j of engine A also covers all
earlier A instructions. The builder therefore only ever posts from the *latest* A instruction a waiter needs,
and skips waits that an earlier wait of the same engine already covers. The timing model replays exactly
these tokens, so the flags are the schedule.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable

import numpy as np

from tvm_dpu.codegen.isa import ENGINE_BITS, Instr, encode_program, instr_spec, make_instr

ENGINES = ("load", "save", "conv", "misc")

#: Parameter buffers split into two slots (halves) that successive ops alternate between (Program.next_slot); a
#: resource named without a slot, e.g. ("convw",), means the whole buffer, i.e. every slot.
SLOTTED = {"convw": 2, "bias": 2}


def _expand(resources: Iterable) -> tuple:
    out = []
    for r in resources:
        if len(r) == 1 and r[0] in SLOTTED:
            out.extend((r[0], k) for k in range(SLOTTED[r[0]]))
        else:
            out.append(r)
    return tuple(out)


#: INIT instructions configure the op that follows; an identical INIT already in force is not re-emitted.
_INITS = {"CONVINIT": "conv", "ALUINIT": "alu", "POOLINIT": "pool", "DWINIT": "dw"}


@dataclass
class _Entry:
    instr: Instr
    engine: str
    reads: tuple = ()
    writes: tuple = ()
    comment: str = ""


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
    _slots: dict = field(default_factory=dict)  # buffer name -> slot used last (see next_slot)
    #: DDR tensor name -> the tensor whose memory it is (a concat input saved into its slice of the concat's
    #: output): ("ddr", name) resources are tracked under the root, so a consumer of the concat waits for the
    #: SAVEs of every producer that wrote a slice.
    ddr_roots: dict = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.entries)

    def next_slot(self, buffer: str, slots: int = 2) -> int:
        """Round-robin slot of an on-chip buffer shared by successive ops (e.g. the halves of the CONVW banks), so
        the next op's parameters can load while this op still computes from the other slot."""
        slot = (self._slots.get(buffer, slots - 1) + 1) % slots
        self._slots[buffer] = slot
        return slot

    def emit(self, name: str, reads: Iterable = (), writes: Iterable = (), comment: str = "", **fields: int) -> int:
        """Append instruction `name` with `fields`; returns its index (or that of the identical INIT in force)."""
        if name in _INITS:
            key = _INITS[name]
            if self._init_state.get(key) == fields:
                return self._init_state[key + "@"]
        spec = instr_spec(name)
        engine = spec.category
        instr = make_instr(name, **fields)
        idx = len(self.entries)
        reads, writes = self._canonical(_expand(reads)), self._canonical(_expand(writes))
        deps: list[int] = []
        for r in reads:
            if r in self._last_writer:
                deps.append(self._last_writer[r])
        for w in writes:
            if w in self._last_writer:
                deps.append(self._last_writer[w])
            deps.extend(self._readers.get(w, ()))
        self.entries.append(_Entry(instr, engine, reads, writes, comment))
        # One wait per source engine, on the newest instruction of that engine this one needs: it completes
        # after every older one (engines run in order).
        newest: dict[str, int] = {}
        for d in deps:
            src = self.entries[d].engine
            newest[src] = max(d, newest.get(src, -1))
        for d in newest.values():
            self._depend(idx, d)
        self._last_of_engine[engine] = idx
        for r in reads:
            self._readers.setdefault(r, []).append(idx)
        for w in writes:
            self._last_writer[w] = idx
            self._readers[w] = []
        if name in _INITS:
            key = _INITS[name]
            self._init_state[key] = dict(fields)
            self._init_state[key + "@"] = idx
        return idx

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
        if self._covered.get(key, -1) >= dep:
            return
        # Post from `dep` itself, not from a later instruction of its engine: a later post would make the waiter
        # wait for work it does not need (e.g. the LOADs of tile t+1 for the CONVs of tile t instead of t-1,
        # which serialises the double buffer). Token order stays consistent: every earlier post of src to dst
        # is at an index <= covered < dep, so the posts reach dst in the order of its waits.
        self.entries[dep].instr.dpdby |= ENGINE_BITS[dst]
        self.entries[idx].instr.dpdon |= ENGINE_BITS[src]
        self._covered[key] = dep

    def end(self) -> None:
        """Append END, which waits for every engine that has work outstanding."""
        before = dict(self._last_of_engine)
        idx = self.emit("END")
        for e, last in before.items():
            self._depend(idx, last)

    @property
    def instrs(self) -> list[Instr]:
        return [e.instr for e in self.entries]

    def encode(self) -> np.ndarray:
        return encode_program(self.instrs)

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for e in self.entries:
            out[e.instr.name] = out.get(e.instr.name, 0) + 1
        return out
