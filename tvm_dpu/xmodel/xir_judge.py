"""AMD's XIR library as the judge of an .xmodel: load it with `xir::Graph::deserialize` (which checks every op against
XIR's op definitions), re-run XIR's shape inference on every op and walk the subgraph tree.

The work is done by a small C++ program of ours (xir_check.cpp beside this file) compiled once with g++ against the
installed libxir (Debian: `apt-get install g++ libxir-dev libunilog-dev`) and cached under `cache_dir()` keyed by
the source's hash; it runs as a child process because XIR aborts the process on a file it refuses.
`xir_unavailable()` says why the check cannot run here (no compiler, no XIR headers, the build failed).
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

from ..security.trust import cache_dir

SOURCE = Path(__file__).with_name("xir_check.cpp")
#: What the checker needs besides a C++17 compiler (Debian's libxir-dev and libunilog-dev).
HEADER = Path("/usr/include/xir/graph/graph.hpp")


class XirUnavailable(RuntimeError):
    """AMD's XIR library or a compiler to build the checker against it is missing: the message says which."""


@dataclass
class XirOp:
    """One op as XIR loaded it: its output's shape in the file and as XIR's shape inference gives it."""
    name: str
    type: str
    device: str
    shape: list[int]
    inferred: list[int]
    dtype: str
    reg_id: int | None = None
    ddr_addr: int | None = None
    location: int | None = None


@dataclass
class XirSubgraph:
    name: str
    parent: str
    depth: int
    device: str
    ops: int
    children: int


@dataclass
class XirReport:
    """The verdict on one file: `ok` when XIR loaded it and every inferred shape equals the file's. `error` is XIR's
    own message when it refused the file (with the op whose shape inference aborted, if any)."""
    path: str
    ok: bool
    error: str = ""
    ops: list[XirOp] = field(default_factory=list)
    subgraphs: list[XirSubgraph] = field(default_factory=list)
    serialized: str = ""

    @property
    def mismatches(self) -> list[XirOp]:
        return [o for o in self.ops if o.shape != o.inferred]

    def summary(self) -> str:
        if self.error:
            return f"{self.path}: XIR refused it: {self.error}"
        bad = "; ".join(f"{o.name} ({o.type}) file {o.shape} vs XIR {o.inferred}" for o in self.mismatches)
        return f"{self.path}: {len(self.ops)} ops loaded" + (f", shape inference disagrees: {bad}" if bad else
                                                             ", XIR's shape inference agrees on every op")


def _compiler() -> str | None:
    """`$CXX`, else g++, as a path on PATH (None when absent)."""
    return shutil.which(os.environ.get("CXX") or "g++")


@lru_cache(maxsize=1)
def _build() -> tuple[Path | None, str]:
    cxx = _compiler()
    if cxx is None:
        return None, f"no C++ compiler ({os.environ.get('CXX') or 'g++'}) to build the XIR checker"
    if not HEADER.exists():
        return None, f"AMD's XIR headers are not installed ({HEADER} missing: apt-get install libxir-dev libunilog-dev)"
    src = SOURCE.read_bytes()
    key = hashlib.sha256(src + cxx.encode()).hexdigest()[:16]
    exe = cache_dir() / "xir_check" / key / "xir_check"
    if exe.exists():
        return exe, ""
    exe.parent.mkdir(parents=True, exist_ok=True)
    tmp = exe.with_name(f"xir_check.tmp{os.getpid()}")
    r = subprocess.run([cxx, "-std=c++17", "-O1", "-o", str(tmp), str(SOURCE), "-lxir", "-lunilog"],
                       capture_output=True, text=True)
    if r.returncode != 0:
        return None, f"building the XIR checker failed ({cxx}): {r.stderr.strip()[-600:]}"
    os.replace(tmp, exe)  # atomic: a concurrent build leaves one complete binary
    return exe, ""


def xir_unavailable() -> str:
    """Why the XIR check cannot run on this machine, or "" when it can."""
    return _build()[1]


def checker() -> Path:
    exe, why = _build()
    if exe is None:
        raise XirUnavailable(why)
    return exe


#: XIR's fatal message (a glog FATAL line, as UNI_LOG_FATAL / CHECK write it), without glog's time and source prefix.
_FATAL = re.compile(r"^F\d{8} [^\]]*\] (.*)$", re.M)


def check_xmodel(path: str | os.PathLike[str], reserialize_to: str | os.PathLike[str] | None = None,
                 timeout: float = 300) -> XirReport:
    """Load `path` with AMD's XIR and re-run its shape inference on every op; with `reserialize_to`, XIR writes
    the graph it loaded there (Graph::serialize) before inferring shapes. XirUnavailable when XIR is absent."""
    cmd = [str(checker()), str(path)] + ([str(reserialize_to)] if reserialize_to is not None else [])
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    rep = XirReport(str(path), ok=False)
    last_infer, done, loaded = "", False, False
    for line in r.stdout.splitlines():
        if not line.startswith('{"event":'):  # anything XIR itself prints
            continue
        ev = json.loads(line)
        kind = ev.pop("event")
        if kind == "op":
            rep.ops.append(XirOp(**ev))
        elif kind == "subgraph":
            rep.subgraphs.append(XirSubgraph(**ev))
        elif kind == "infer":
            last_infer = ev["op"]
        elif kind == "serialized":
            rep.serialized = ev["path"]
        done |= kind == "done"
        loaded |= kind == "loaded"
    if r.returncode not in (0, 1) or not done:
        fatal = [m.group(1) for m in _FATAL.finditer(r.stderr)]
        msg = (fatal[0] if fatal else r.stderr.strip().splitlines()[-1] if r.stderr.strip() else
               f"exit status {r.returncode}")
        where = f"in shape inference of op {last_infer!r}: " if loaded and last_infer else "on load: "
        rep.error = where + msg
        return rep
    rep.ok = r.returncode == 0 and not rep.mismatches
    return rep
