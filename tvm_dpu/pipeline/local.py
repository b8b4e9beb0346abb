"""The "local" pipeline executor: one thread and one queue per stage, in this process.

Each stage runs on its own device (an emulator of its arch unless the stage model was given one) from its own
long-lived thread, so stages work on different frames at the same time, as boards would, and each keeps its
Relax VM between frames. Several streams may run at once: a frame carries its stream, and the last stage hands it
to that stream's result queue. Frames of a stream stay in order because every queue is FIFO and every stage
handles one frame at a time. The caller's thread feeds its own frames, at most `max_in_flight` at a time.

A stage that passes int8 through (`PipelineStage.phased`) is double-buffered as a board runs it: one thread
prepares frame f+1 (DDR regions, the input placed), one runs the DPU program on frame f, one reads frame f-1 back
and sends it on, with at most one frame waiting between two of them; so the stage's period is the longest of the
three, not their sum (`LocalEngine(overlap=False)`: one thread does all three in turn).

A failure travels down the stages in its frame's place (later stages pass it on), so the frames before it are
delivered and the consumer raises when it reaches it; frames of a stream that has stopped are dropped by the
stages. The threads end when the engine is closed or collected.
"""
from __future__ import annotations

import queue
import threading
import weakref
from dataclasses import dataclass, field
from typing import Any, Iterable, Iterator

_STOP = None  # sentinel on a stage queue: the thread ends


@dataclass
class _Failure:
    stage: int
    error: BaseException


@dataclass
class _Stream:
    results: queue.Queue = field(default_factory=queue.Queue)
    stopped: bool = False


def _relay(inbox: queue.Queue, work: Any, index: int, put: Any) -> None:
    """Take (stream, seq, value) items off `inbox` until _STOP (handed on): drop those of a stopped stream, replace
    the value by `work(value)` (a failure, raised or arrived, travels on in the frame's place) and `put` them."""
    while True:
        item = inbox.get()
        if item is _STOP:
            put(_STOP)
            return
        stream, seq, value = item
        if stream.stopped:
            continue
        if not isinstance(value, _Failure):
            try:
                value = work(value)
            except BaseException as e:  # noqa: BLE001 - handed to the stream's consumer, which raises it
                value = _Failure(index, e)
        put((stream, seq, value))


def _deliver(outbox: queue.Queue | None) -> Any:
    """Where a stage's finished frames go: the next stage's inbox, or (the last stage) the frame's stream."""
    def put(item: Any) -> None:
        if outbox is not None:
            outbox.put(item)
        elif item is not _STOP:
            stream, seq, payload = item
            stream.results.put((seq, payload))
    return put


def _serve(stage: Any, fix_points: dict, index: int, inbox: queue.Queue, outbox: queue.Queue | None) -> None:
    """Body of stage `index`'s thread (no reference to the engine, so the engine can be collected)."""
    _relay(inbox, lambda payload: stage.run_payload(payload, fix_points), index, _deliver(outbox))


def _serve_phased(stage: Any, fix_points: dict, index: int, inbox: queue.Queue, outbox: queue.Queue | None) -> None:
    """Body of a double-buffered stage's host thread (see the module docstring): it prepares each frame, behind it
    a DPU thread runs it and a read-back thread sends it on, at most one frame waiting between two of them."""
    to_dpu: queue.Queue = queue.Queue(maxsize=1)
    to_host: queue.Queue = queue.Queue(maxsize=1)

    def execute(regions: dict) -> dict:
        stage.execute(regions)
        return regions

    helpers = [threading.Thread(target=_relay, args=(to_dpu, execute, index, to_host.put), daemon=True,
                                name=f"tvm-dpu-stage{index}-dpu"),
               threading.Thread(target=_relay, args=(to_host, stage.finish, index, _deliver(outbox)), daemon=True,
                                name=f"tvm-dpu-stage{index}-finish")]
    for t in helpers:
        t.start()
    _relay(inbox, lambda payload: stage.prepare(payload, fix_points), index, to_dpu.put)
    for t in helpers:
        t.join()


def _stop_threads(first: queue.Queue) -> None:
    first.put(_STOP)


class LocalEngine:
    """Runs a PipelineModel's stages on threads of this process."""

    def __init__(self, pipe: Any, overlap: bool = True):
        stages = pipe.stages
        self._stages = stages
        self._inboxes = [queue.Queue() for _ in stages]
        self._threads = []
        for i, st in enumerate(stages):
            outbox = self._inboxes[i + 1] if i + 1 < len(stages) else None
            serve = _serve_phased if overlap and st.phased() else _serve
            t = threading.Thread(target=serve, args=(st, dict(pipe.fix_points), i, self._inboxes[i], outbox),
                                 name=f"tvm-dpu-stage{i}", daemon=True)
            t.start()
            self._threads.append(t)
        self._finalizer = weakref.finalize(self, _stop_threads, self._inboxes[0])

    def stats(self) -> list[dict]:
        """Per stage: frames run and seconds spent in them."""
        return [st.stats() for st in self._stages]

    def close(self) -> None:
        """End the stage threads (after the frames already queued)."""
        self._finalizer()
        for t in self._threads:
            t.join(timeout=30.0)

    def _next_result(self, stream: _Stream) -> tuple[int, Any]:
        from tvm_dpu.pipeline.stages import PipelineError

        while True:
            try:
                return stream.results.get(timeout=1.0)
            except queue.Empty:
                dead = [i for i, t in enumerate(self._threads) if not t.is_alive()]
                if dead:  # closed from another thread while this stream waited
                    raise PipelineError(f"stage thread(s) {dead} ended (the executor was closed) with frames in "
                                        "flight") from None

    def stream(self, payloads: Iterable[dict], max_in_flight: int) -> Iterator[dict]:
        from tvm_dpu.pipeline.stages import PipelineError

        if not self._finalizer.alive:
            raise PipelineError("this pipeline's local executor is closed")
        stream = _Stream()
        frames = iter(payloads)
        fed = done = 0
        bad_input: BaseException | None = None
        try:
            while True:
                while bad_input is None and fed - done < max_in_flight:
                    try:
                        payload = next(frames)
                    except StopIteration:
                        break
                    except Exception as e:  # noqa: BLE001 - a bad frame: raised after the frames before it
                        bad_input = e
                        break
                    self._inboxes[0].put((stream, fed, payload))
                    fed += 1
                if done == fed:
                    if bad_input is not None:
                        raise bad_input
                    return
                seq, payload = self._next_result(stream)
                done += 1
                if isinstance(payload, _Failure):
                    spec = self._stages[payload.stage].spec
                    e = payload.error
                    raise PipelineError(f"stage {spec.index} ({spec.board}, {spec.arch}) failed on frame {seq}: "
                                        f"{type(e).__name__}: {e}") from e
                yield payload
        finally:
            stream.stopped = True  # frames of this stream still queued are dropped
