"""Server-side batching: concurrent requests to one signature run as one call.

No batching threads: the request threads take turns. A request that finds fewer than
`num_batch_threads` batches running runs at once in its own thread, taking along every compatible
request queued so far (up to `max_batch_size` rows), and hands the results to their threads. A
request that finds them all busy queues; when a batch ends, the oldest queued request is woken to
run the next one. So a request never waits for partners that are not there (a lone request pays two
uncontended locks), under load the model sees large batches, and no request crosses more than one
thread hand-off. `batch_timeout_micros` is TF Serving's knob (written to batching.config for it);
here the running batch is the timeout.
"""
from __future__ import annotations

import threading
from collections import deque
from typing import Callable

import grpc
import numpy as np

from serving.errors import ServingError

Inputs = dict[str, np.ndarray]
Run = Callable[[Inputs], dict[str, np.ndarray]]


class _Request:
    __slots__ = ("inputs", "rows", "key", "wake", "done", "result", "error")

    def __init__(self, inputs: Inputs, rows: int, key):
        self.inputs, self.rows, self.key = inputs, rows, key
        self.wake = None  # a held lock, released to wake the waiting thread
        self.done = False
        self.result = self.error = None


def _rows_and_key(inputs: Inputs):
    """Rows (the shared first dimension) and what must match for two requests to be concatenated."""
    rows = None
    key = []
    for name in sorted(inputs):
        array = inputs[name]
        if array.ndim == 0:
            return None, None
        if rows is None:
            rows = array.shape[0]
        elif array.shape[0] != rows:
            return None, None
        key.append((name, array.dtype.str, array.shape[1:]))
    return rows, tuple(key)


class Batcher:
    def __init__(self, run: Run, max_batch_size: int, threads: int, max_enqueued: int):
        self._run = run
        self._max_rows = max_batch_size
        self._max_running = threads
        self._max_waiting = max_enqueued * max_batch_size
        self._lock = threading.Lock()
        self._running = 0  # batches being run (or about to be, by a woken request)
        self._waiting: deque[_Request] = deque()

    def submit(self, inputs: Inputs) -> dict[str, np.ndarray]:
        with self._lock:
            alone = self._running < self._max_running and not self._waiting
            if alone:
                self._running += 1
        if alone:  # nobody queued to take along: run it as it is
            try:
                return self._run(inputs)
            finally:
                self._next()
        rows, key = _rows_and_key(inputs)
        if rows is None or rows >= self._max_rows:
            return self._run(inputs)  # not batchable, or a batch already
        request = _Request(inputs, rows, key)
        with self._lock:
            lead = self._running < self._max_running
            if lead:
                self._running += 1
            elif len(self._waiting) >= self._max_waiting:
                raise ServingError(grpc.StatusCode.RESOURCE_EXHAUSTED, "the batching queue is full; retry later")
            else:
                request.wake = threading.Lock()
                request.wake.acquire()
                self._waiting.append(request)
        if not lead:
            request.wake.acquire()  # released when another batch ran this request, or when it is our turn
            if request.done:
                if request.error is not None:
                    raise request.error
                return request.result
        try:
            self._run_batch(request)
        finally:
            self._next()
        if request.error is not None:
            raise request.error
        return request.result

    def _next(self) -> None:
        """A batch ended: wake the oldest queued request to run the next one, or free the slot."""
        with self._lock:
            if self._waiting:
                self._waiting.popleft().wake.release()
            else:
                self._running -= 1

    def _take_partners(self, first: _Request) -> list[_Request]:
        batch, rows = [first], first.rows
        with self._lock:
            if not self._waiting:
                return batch
            skipped = deque()
            while self._waiting and rows < self._max_rows:
                other = self._waiting.popleft()
                if other.key == first.key and rows + other.rows <= self._max_rows:
                    batch.append(other)
                    rows += other.rows
                else:
                    skipped.append(other)  # waits for a batch of its own kind, keeping its place
            skipped.extend(self._waiting)
            self._waiting = skipped
        return batch

    def _run_batch(self, first: _Request) -> None:
        batch = self._take_partners(first)
        if len(batch) == 1:
            self._run_one(first)
            return
        try:
            merged = {name: np.concatenate([r.inputs[name] for r in batch]) for name in first.inputs}
            outputs = self._run(merged)
            total = sum(r.rows for r in batch)
            if any(v.ndim == 0 or v.shape[0] != total for v in outputs.values()):
                raise ValueError("an output is not batch-major")
        except Exception:
            # One bad request must not fail its neighbours: run them one by one.
            for r in batch:
                self._run_one(r)
                self._deliver(r, first)
            return
        start = 0
        for r in batch:
            r.result = {k: v[start:start + r.rows] for k, v in outputs.items()}
            start += r.rows
            self._deliver(r, first)

    def _run_one(self, request: _Request) -> None:
        try:
            request.result = self._run(request.inputs)
        except BaseException as exc:  # delivered to the request's own thread
            request.error = exc

    @staticmethod
    def _deliver(request: _Request, first: _Request) -> None:
        if request is not first:
            request.done = True
            request.wake.release()
