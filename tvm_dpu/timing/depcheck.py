"""The DPU's dpdon/dpdby token protocol (docs/dependency-protocol.md) and a checker of programs against it.

The protocol, as vai_c's own programs use it:

* one token counter per ordered engine pair (src, dst), engines LOAD, SAVE, CONV, MISC (bit 0..3 of the masks);
* an instruction on engine e waits, before it starts, until counter (s, e) > 0 for every s of its `dpdon` and
  takes one token from each; when it completes it adds one token to (e, d) for every d of its `dpdby`;
* own-engine pairs (e, e) start with one token (`OWN_CREDIT`), cross pairs with none: every engine's first
  instruction in vai_c's programs waits on its own engine, and nothing posted before it;
* at END every counter is back where it started (own pairs 1, cross pairs 0): posts equal waits per pair.

The checker replays the tokens without timing (any order the counters allow), which finds deadlocks, tokens left
at END and each pair's counts; from it follows the happens-before order of the instructions (vector clocks over
the four engine queues, assuming each engine starts and completes its own instructions in program order). Given
each instruction's bank rows and DDR bytes (recorded by the emulator: runtime.access_trace), `check` reports any
two instructions of different engines touching the same place, one of them writing, that no chain of tokens
orders: a race on hardware, which the sequential emulator cannot show.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from tvm_dpu.codegen.isa import DEFAULT_ISA, Instr, decode_program, instr_spec
from tvm_dpu.timing.cost import ENGINES
from tvm_dpu.timing.params import TimingError

_SHORT = "LSCM"

#: Tokens an own-engine counter holds when a program starts (and must hold again at END).
OWN_CREDIT = 1

#: The most tokens a cross-engine counter holds along program order in any vai_c program measured: 131, in vai_c
#: 3.5's YOLOX-nano for B1152 (the amd-contest build; save->load reaches 111 there), where PointPillars' RPN
#: subgraph holds 28, the other YOLOX-nano sizes 6-12, DPU-PYNQ's MNIST 2 and the small TF2 programs 1
#: (docs/dependency-protocol.md). No source gives the hardware counters' width: the checker flags a program that
#: needs more than vai_c's programs are seen to use. tvm-dpu's own code generator keeps every counter at 1, except
#: where an emitter asks for more (Program.deeper_counters: the conv -> window chains, 2).
COUNTER_DEPTH = 131
#: What the code generator commits to (checked on the zoo's programs in tests/test_depcheck.py).
CODEGEN_COUNTER_DEPTH = 2


def engine_of(ins: Instr, isa: str = DEFAULT_ISA) -> int:
    """Engine index (0 LOAD, 1 SAVE, 2 CONV, 3 MISC) of an instruction's category in instruction set `isa`."""
    return ENGINES.index(instr_spec(ins.name, isa).category)


def initial_tokens() -> list[list[int]]:
    """tokens[src][dst] when a program starts."""
    return [[OWN_CREDIT if s == d else 0 for d in range(4)] for s in range(4)]


def pair_name(src: int, dst: int) -> str:
    return f"{ENGINES[src]}->{ENGINES[dst]}"


def mask_str(mask: int) -> str:
    """'LC' for LOAD|CONV, '-' for none."""
    return "".join(_SHORT[i] for i in range(4) if mask >> i & 1) or "-"


@dataclass
class Access:
    """Where one instruction reads and writes: bank row keys (bank * depth + row) and DDR items
    (reg_id, first byte, items, bytes per item, pitch)."""

    bank_reads: list[np.ndarray] = field(default_factory=list)
    bank_writes: list[np.ndarray] = field(default_factory=list)
    ddr_reads: list[tuple[int, int, int, int, int]] = field(default_factory=list)
    ddr_writes: list[tuple[int, int, int, int, int]] = field(default_factory=list)


@dataclass
class Race:
    """Two instructions of different engines touching the same place, one writing, with no token chain between."""

    first: int
    second: int
    kind: str  # RAW, WAR, WAW
    where: str

    def __str__(self) -> str:
        return f"{self.kind} race: instruction {self.first} and {self.second} both touch {self.where} unordered"


@dataclass
class DepReport:
    """What `check` found in one program."""

    instructions: int
    names: list[str]
    engine: list[int]
    dpdon: list[int]
    dpdby: list[int]
    posts: np.ndarray  # (4, 4) posts[src][dst]
    waits: np.ndarray  # (4, 4)
    depth: np.ndarray  # (4, 4) most tokens a counter holds along program order
    #: (4, 4) most tokens a cross counter holds when its destination engine runs as late as the tokens allow
    #: (every other engine runs ahead first): what a counter must hold if posting never stalls
    runahead: np.ndarray = field(default_factory=lambda: np.zeros((4, 4), np.int64))
    problems: list[str] = field(default_factory=list)
    races: list[Race] = field(default_factory=list)
    races_checked: bool = False
    counter_depth: int = COUNTER_DEPTH

    @property
    def ok(self) -> bool:
        return not self.problems and not self.races

    @property
    def own_on(self) -> float:
        """Fraction of instructions whose dpdon names their own engine."""
        n = self.instructions
        return sum(on >> e & 1 for on, e in zip(self.dpdon, self.engine)) / n if n else 0.0

    @property
    def own_by(self) -> float:
        n = self.instructions
        return sum(by >> e & 1 for by, e in zip(self.dpdby, self.engine)) / n if n else 0.0

    def pairs(self) -> dict[str, dict[str, int]]:
        """{'load->conv': {'posts', 'waits', 'depth'}} for every pair used."""
        out = {}
        for s in range(4):
            for d in range(4):
                if self.posts[s][d] or self.waits[s][d]:
                    out[pair_name(s, d)] = {"posts": int(self.posts[s][d]), "waits": int(self.waits[s][d]),
                                            "depth": int(self.depth[s][d])}
        return out

    def max_runahead(self) -> int:
        return max((int(self.runahead[s][d]) for s in range(4) for d in range(4) if s != d), default=0)

    def max_cross_depth(self) -> int:
        return max((int(self.depth[s][d]) for s in range(4) for d in range(4) if s != d), default=0)

    def ends(self, k: int = 1) -> dict[str, list[str]]:
        """The first and last k instructions as 'NAME on=.. by=..'."""
        def fmt(i: int) -> str:
            return f"{self.names[i]} on={mask_str(self.dpdon[i])} by={mask_str(self.dpdby[i])}"
        n = self.instructions
        return {"first": [fmt(i) for i in range(min(k, n))], "last": [fmt(i) for i in range(max(0, n - k), n)]}

    def summary(self) -> dict[str, Any]:
        return {"instructions": self.instructions, "own_dpdon": round(self.own_on, 4),
                "own_dpdby": round(self.own_by, 4), "pairs": self.pairs(), "max_cross_depth": self.max_cross_depth(),
                "max_runahead": self.max_runahead(),
                **self.ends(), "problems": list(self.problems), "races": [str(r) for r in self.races],
                "races_checked": self.races_checked, "ok": self.ok}

    def raise_for_problems(self, what: str = "program") -> None:
        """TimingError listing every problem and race (the first few of each)."""
        if self.ok:
            return
        msgs = self.problems[:5] + [str(r) for r in self.races[:5]]
        more = len(self.problems) + len(self.races) - len(msgs)
        raise TimingError(f"{what} breaks the dependency protocol: " + "; ".join(msgs)
                          + (f" (and {more} more)" if more > 0 else ""))


def _decode(code: Any, isa: str) -> list[Instr]:
    if isinstance(code, list) and (not code or isinstance(code[0], Instr)):
        return code
    return decode_program(np.asarray(code, dtype=np.uint32), isa)


def describe(i: int, names: Sequence[str], engine: Sequence[int]) -> str:
    return f"instruction {i} ({names[i]}, engine {ENGINES[engine[i]]})"


def check(code: Any, accesses: Sequence[Access] | None = None, bank_depth: int = 0,
          counter_depth: int = COUNTER_DEPTH, isa: str = DEFAULT_ISA) -> DepReport:
    """Check machine code (or decoded instructions) against the protocol; with `accesses` (one per instruction,
    from runtime.access_trace) also for races. `bank_depth` (rows per bank) only makes race reports readable; `isa`:
    the instruction set of `code` (which engine each instruction belongs to)."""
    instrs = _decode(code, isa)
    n = len(instrs)
    engine = [engine_of(x, isa) for x in instrs]
    names = [x.name for x in instrs]
    dpdon = [x.dpdon for x in instrs]
    dpdby = [x.dpdby for x in instrs]
    posts = np.zeros((4, 4), np.int64)
    waits = np.zeros((4, 4), np.int64)
    depth = np.zeros((4, 4), np.int64)
    count = np.array(initial_tokens(), np.int64)
    depth[:] = count
    for i in range(n):
        e = engine[i]
        for s in range(4):
            if dpdon[i] >> s & 1:
                waits[s][e] += 1
                count[s][e] -= 1
        for d in range(4):
            if dpdby[i] >> d & 1:
                posts[e][d] += 1
                count[e][d] += 1
                depth[e][d] = max(depth[e][d], count[e][d])
    rep = DepReport(n, names, engine, dpdon, dpdby, posts, waits, depth, counter_depth=counter_depth)
    clocks = _replay(rep)
    if clocks is not None:
        rep.runahead = _runahead(rep)
    for s in range(4):
        for d in range(4):
            if s != d and depth[s][d] > counter_depth:
                rep.problems.append(f"counter {pair_name(s, d)} holds up to {depth[s][d]} tokens along program "
                                    f"order (more than the {counter_depth} this check allows)")
    if accesses is not None and clocks is not None:
        if len(accesses) != n:
            raise TimingError(f"{len(accesses)} access records for {n} instructions")
        rep.races = _races(engine, clocks, accesses, bank_depth)
        rep.races_checked = True
    return rep


def _replay(rep: DepReport) -> list[tuple[int, ...]] | None:
    """Run the tokens untimed (each engine in program order, any interleaving the counters allow). Adds deadlock
    and END-balance problems to `rep`; returns each instruction's start clock (per engine, the queue position of
    the newest instruction known complete before it starts; -1 none), or None after a deadlock."""
    n = rep.instructions
    engine = rep.engine
    queues: list[list[int]] = [[] for _ in range(4)]
    pos = [0] * n
    for i, e in enumerate(engine):
        pos[i] = len(queues[e])
        queues[e].append(i)
    needs = [[s for s in range(4) if on >> s & 1] for on in rep.dpdon]
    gives = [[d for d in range(4) if by >> d & 1] for by in rep.dpdby]
    # Token FIFOs carry the completion clock of the instruction that posted them; initial credits carry nothing.
    none = (-1, -1, -1, -1)
    fifo: list[list[list[tuple[int, ...]]]] = [[[none] * OWN_CREDIT if s == d else [] for d in range(4)]
                                               for s in range(4)]
    rd = [[0] * 4 for _ in range(4)]  # read pointer of each fifo
    head = [0] * 4
    last_clock = [none] * 4
    start: list[tuple[int, ...]] = [none] * n
    last_post: dict[tuple[int, int], int] = {}
    done = 0
    progress = True
    while done < n and progress:
        progress = False
        for e in range(4):
            while head[e] < len(queues[e]):
                i = queues[e][head[e]]
                if any(rd[s][e] >= len(fifo[s][e]) for s in needs[i]):
                    break
                clk = list(last_clock[e])
                for s in needs[i]:
                    c = fifo[s][e][rd[s][e]]
                    rd[s][e] += 1
                    for k in range(4):
                        if c[k] > clk[k]:
                            clk[k] = c[k]
                start[i] = last_clock[e] = tuple(clk)
                clk[e] = pos[i]  # completes after every earlier instruction of its engine (in-order completion)
                fin = tuple(clk)
                for d in gives[i]:
                    fifo[e][d].append(fin)
                    last_post[(e, d)] = i
                head[e] += 1
                done += 1
                progress = True
    if done < n:
        for e in range(4):
            if head[e] < len(queues[e]):
                i = queues[e][head[e]]
                missing = [ENGINES[s] for s in needs[i] if rd[s][e] >= len(fifo[s][e])]
                rep.problems.append(f"deadlock: {describe(i, rep.names, engine)} waits for a token from "
                                    f"{', '.join(missing)} that is never posted")
        return None
    for s in range(4):
        for d in range(4):
            left = len(fifo[s][d]) - rd[s][d] - (OWN_CREDIT if s == d else 0)
            if left > 0:
                i = last_post[(s, d)]
                rep.problems.append(f"{left} token(s) {pair_name(s, d)} left over at END (last posted by "
                                    f"{describe(i, rep.names, engine)})")
            elif left < 0:
                # An own counter ends below its credit: the next program's first instruction would deadlock.
                rep.problems.append(f"own counter {pair_name(s, d)} ends the program {-left} token(s) short of its "
                                    f"initial {OWN_CREDIT}: the next program's first {ENGINES[s]} instruction waits "
                                    f"forever")
    return start


def min_capacity(rep: DepReport) -> int:
    """The fewest tokens every counter must hold for the program to run to its end when an instruction that would
    post to a full counter waits (does not complete) until the counter's engine takes a token. 0 after a deadlock.

    Running any instruction that can run never stops another engine's next instruction from running (it only
    takes tokens posted to its own engine and adds tokens to its own engine's counters), so the untimed replay
    that runs whatever can run finishes exactly when some schedule does; the capacity is found by bisection."""
    if rep.problems and any(p.startswith("deadlock") for p in rep.problems):
        return 0
    hi = max(OWN_CREDIT, int(rep.depth.max()))
    if not _runs_with(rep, hi):
        hi = max(hi, rep.instructions + OWN_CREDIT)
        if not _runs_with(rep, hi):
            return 0
    lo = 1
    while lo < hi:
        mid = (lo + hi) // 2
        if _runs_with(rep, mid):
            hi = mid
        else:
            lo = mid + 1
    return lo


def _runs_with(rep: DepReport, capacity: int) -> bool:
    """Whether the untimed replay with counters of `capacity` tokens (a post to a full counter waits) ends."""
    engine = rep.engine
    queues: list[list[int]] = [[] for _ in range(4)]
    for i, e in enumerate(engine):
        queues[e].append(i)
    needs = [[s for s in range(4) if on >> s & 1] for on in rep.dpdon]
    gives = [[d for d in range(4) if by >> d & 1] for by in rep.dpdby]
    tokens = initial_tokens()
    head = [0] * 4
    left = rep.instructions
    progress = True
    while left and progress:
        progress = False
        for e in range(4):
            q = queues[e]
            row = tokens[e]
            while head[e] < len(q):
                i = q[head[e]]
                if any(tokens[s][e] <= 0 for s in needs[i]):
                    break
                # the tokens it takes are gone before it posts (an own bit takes and gives back one)
                if any(row[d] - (1 if d == e and e in needs[i] else 0) >= capacity for d in gives[i]):
                    break
                for s in needs[i]:
                    tokens[s][e] -= 1
                for d in gives[i]:
                    row[d] += 1
                head[e] += 1
                left -= 1
                progress = True
    return left == 0


def _runahead(rep: DepReport) -> np.ndarray:
    """Per cross pair (s, d): the most tokens (s, d) holds in the untimed replay that runs engine d only when no
    other engine can move (the program is known not to deadlock)."""
    engine = rep.engine
    queues: list[list[int]] = [[] for _ in range(4)]
    for i, e in enumerate(engine):
        queues[e].append(i)
    out = np.zeros((4, 4), np.int64)
    for d in range(4):
        tokens = initial_tokens()
        head = [0] * 4
        best = [0] * 4
        left = rep.instructions
        while left:
            moved = False
            for e in [x for x in range(4) if x != d] + [d]:
                while head[e] < len(queues[e]):
                    i = queues[e][head[e]]
                    on = rep.dpdon[i]
                    if any(on >> s & 1 and tokens[s][e] <= 0 for s in range(4)):
                        break
                    for s in range(4):
                        if on >> s & 1:
                            tokens[s][e] -= 1
                    for t in range(4):
                        if rep.dpdby[i] >> t & 1:
                            tokens[e][t] += 1
                    head[e] += 1
                    left -= 1
                    moved = True
                    for s in range(4):
                        best[s] = max(best[s], tokens[s][d])
                    if e == d:
                        break  # one step of d, then let the others run ahead again
                if moved:
                    break
            if not moved:
                break
        for s in range(4):
            if s != d:
                out[s][d] = best[s]
    return out


def _ddr_bytes(items: list[tuple[int, int, int, int, int]], base: dict[int, int]) -> np.ndarray:
    parts = []
    for rid, addr, n, width, pitch in items:
        if n <= 0 or width <= 0:
            continue
        off = base[rid] + addr
        if pitch == width or n == 1:
            parts.append(np.arange(off, off + n * width if pitch == width else off + width, dtype=np.int64))
        else:
            parts.append((off + np.arange(n, dtype=np.int64)[:, None] * pitch
                          + np.arange(width, dtype=np.int64)[None, :]).reshape(-1))
    return np.unique(np.concatenate(parts)) if parts else np.zeros(0, np.int64)


def _races(engine: list[int], clocks: list[tuple[int, ...]], accesses: Sequence[Access],
           bank_depth: int) -> list[Race]:
    """Vector-clock race detection over bank rows and DDR bytes, in program order (the order the emulator, and
    AMD's simulator, give every program's meaning)."""
    n = len(engine)
    pos = [0] * n
    seen = [0] * 4
    for i, e in enumerate(engine):
        pos[i] = seen[e]
        seen[e] += 1
    # One index space per kind of place; DDR regions laid out one after another.
    rids = sorted({it[0] for a in accesses for it in a.ddr_reads + a.ddr_writes})
    size: dict[int, int] = {}
    for a in accesses:
        for rid, addr, cnt, width, pitch in a.ddr_reads + a.ddr_writes:
            if cnt > 0:
                size[rid] = max(size.get(rid, 0), addr + (cnt - 1) * pitch + width)
    base, total = {}, 0
    for rid in rids:
        base[rid] = total
        total += size.get(rid, 0)
    rows = [np.unique(np.concatenate(a.bank_reads)) if a.bank_reads else None for a in accesses]
    wrows = [np.unique(np.concatenate(a.bank_writes)) if a.bank_writes else None for a in accesses]
    nrows = 1 + max([int(r.max()) for r in rows + wrows if r is not None and r.size] or [0])
    pos_arr = np.array(pos + [0], np.int64)
    eng_arr = np.array(engine + [0], np.int64)
    races: list[Race] = []
    for space, size_, reads_of, writes_of, name in (
            ("bank", nrows, lambda i: rows[i], lambda i: wrows[i], "bank"),
            ("ddr", total, lambda i: _ddr_bytes(accesses[i].ddr_reads, base) if accesses[i].ddr_reads else None,
             lambda i: _ddr_bytes(accesses[i].ddr_writes, base) if accesses[i].ddr_writes else None, "ddr")):
        if size_ == 0:
            continue
        writer = np.full(size_, n, np.int64)  # n: none (pos_arr[n] = 0, and the check below masks it)
        reader = np.full((4, size_), n, np.int64)
        for i in range(n):
            e = engine[i]
            clk = np.array(clocks[i], np.int64)
            r, w = reads_of(i), writes_of(i)
            for keys, kind in ((r, "RAW"), (w, "WAW")):
                if keys is None or not keys.size:
                    continue
                prev = writer[keys]
                bad = (prev < n) & (eng_arr[prev] != e)
                if bad.any():
                    bad &= clk[eng_arr[prev]] < pos_arr[prev]
                if bad.any():
                    k = int(np.argmax(bad))
                    races.append(Race(int(prev[k]), i, kind, _where(space, int(keys[k]), bank_depth, base)))
            if w is not None and w.size:
                for f in range(4):
                    if f == e:
                        continue
                    prev = reader[f][w]
                    bad = (prev < n) & (clk[f] < pos_arr[prev])
                    if bad.any():
                        k = int(np.argmax(bad))
                        races.append(Race(int(prev[k]), i, "WAR", _where(space, int(w[k]), bank_depth, base)))
            if r is not None and r.size:
                reader[e][r] = i
            if w is not None and w.size:
                writer[w] = i
                reader[:, w] = n
            if len(races) > 100:
                return races
    return races


def _where(space: str, key: int, bank_depth: int, base: dict[int, int]) -> str:
    if space == "bank":
        return f"bank {key // bank_depth} row {key % bank_depth}" if bank_depth else f"bank row key {key}"
    rid = max((r for r, b in base.items() if b <= key), key=lambda r: base[r])
    return f"DDR region {rid} byte {key - base[rid]}"
