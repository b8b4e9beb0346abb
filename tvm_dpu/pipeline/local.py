"""The "local" pipeline executor: one thread and one bounded queue per stage, in this process.

Each stage runs on its own device (an emulator of its arch unless the stage model was given one), so stages work
on different frames at the same time, as boards would. Frames stay in order because every queue is FIFO and every
stage handles one frame at a time. A failure travels down the queues in its frame's place, so frames before it
are delivered and the consumer raises when it reaches it; then every thread is told to stop (queue operations
poll a stop flag, so nothing waits forever on a queue nobody serves).
"""
from __future__ import annotations

import queue
import threading
from dataclasses import dataclass
from typing import Any, Iterable, Iterator

_POLL_S = 0.05
_STOP = object()


@dataclass
class _Failure:
    stage: int | None  # None: the frame itself was bad (raised while reading the input)
    frame: int
    error: BaseException


class LocalEngine:
    """Runs a PipelineModel's stages on threads of this process."""

    def __init__(self, pipe: Any):
        self.pipe = pipe

    def close(self) -> None:
        """Nothing persists between streams (threads live for one stream)."""

    def stream(self, payloads: Iterable[dict], max_in_flight: int) -> Iterator[dict]:
        from tvm_dpu.pipeline.stages import PipelineError

        stages = self.pipe.stages
        fix_points = self.pipe.fix_points
        n = len(stages)
        queues = [queue.Queue(maxsize=max_in_flight) for _ in range(n + 1)]
        stop = threading.Event()
        slots = threading.Semaphore(max_in_flight)

        def put(q: queue.Queue, item: Any) -> bool:
            while not stop.is_set():
                try:
                    q.put(item, timeout=_POLL_S)
                    return True
                except queue.Full:
                    continue
            return False

        def get(q: queue.Queue) -> Any:
            while not stop.is_set():
                try:
                    return q.get(timeout=_POLL_S)
                except queue.Empty:
                    continue
            return _STOP

        def worker(i: int) -> None:
            stage = stages[i]
            while True:
                item = get(queues[i])
                if item is _STOP:
                    put(queues[i + 1], _STOP)
                    return
                seq, payload = item
                if not isinstance(payload, _Failure):
                    try:
                        payload = stage.run_payload(payload, fix_points)
                    except BaseException as e:  # noqa: BLE001 - handed to the consumer, which raises it
                        payload = _Failure(i, seq, e)
                if not put(queues[i + 1], (seq, payload)):
                    return

        def feeder() -> None:
            seq = 0
            it = iter(payloads)
            while True:
                while not slots.acquire(timeout=_POLL_S):
                    if stop.is_set():
                        return
                try:
                    payload = next(it)
                except StopIteration:
                    break
                except BaseException as e:  # noqa: BLE001 - a bad frame: raised by the consumer in its place
                    put(queues[0], (seq, _Failure(None, seq, e)))
                    break
                if not put(queues[0], (seq, payload)):
                    return
                seq += 1
            put(queues[0], _STOP)

        threads = [threading.Thread(target=worker, args=(i,), name=f"tvm-dpu-stage{i}", daemon=True)
                   for i in range(n)]
        threads.append(threading.Thread(target=feeder, name="tvm-dpu-feeder", daemon=True))
        for t in threads:
            t.start()
        try:
            while True:
                item = queues[n].get()
                if item is _STOP:
                    return
                seq, payload = item
                slots.release()
                if isinstance(payload, _Failure):
                    if payload.stage is None:
                        raise payload.error
                    spec = stages[payload.stage].spec
                    e = payload.error
                    raise PipelineError(f"stage {spec.index} ({spec.board}, {spec.arch}) failed on frame {seq}: "
                                        f"{type(e).__name__}: {e}") from e
                yield payload
        finally:
            stop.set()
            for t in threads:
                t.join(timeout=5.0)
