"""Where a compile's time goes: wall seconds and process (CPU) seconds per named phase.

Both are kept because the machines compiles are measured on are shared: wall time moves with the other jobs,
process time (every thread of this process, user + system) hardly does."""
from __future__ import annotations

import time


class PhaseClock:
    """Laps of named phases: `lap(name)` charges the time since the previous lap (or the start) to `name`."""

    def __init__(self) -> None:
        self.wall: dict[str, float] = {}
        self.cpu: dict[str, float] = {}
        self._start = self._last = (time.perf_counter(), time.process_time())

    def lap(self, name: str) -> None:
        """Charge the wall and process seconds since the previous lap to phase `name` (added to what it has)."""
        now = (time.perf_counter(), time.process_time())
        self.wall[name] = self.wall.get(name, 0.0) + now[0] - self._last[0]
        self.cpu[name] = self.cpu.get(name, 0.0) + now[1] - self._last[1]
        self._last = now

    def since_start(self) -> tuple[float, float]:
        """(wall, process) seconds since the clock was made."""
        return time.perf_counter() - self._start[0], time.process_time() - self._start[1]
