"""Server-side batching: concurrent requests to one signature run as one call.

Batches close greedily: a worker takes whatever has queued (up to `max_batch_size` rows) while the
previous batch ran, so a request never waits for partners that are not there, and under load the
model sees large batches. A request arriving while no other is in flight runs at once in its own
thread (no hand-off at low load). `batch_timeout_micros` is TF Serving's knob (written to
batching.config for it); here the queue itself is the timeout.
"""
from __future__ import annotations

import queue
import threading
from concurrent.futures import Future
from typing import Callable

import numpy as np

Inputs = dict[str, np.ndarray]
Run = Callable[[Inputs], dict[str, np.ndarray]]


class _Request:
    __slots__ = ("inputs", "rows", "key", "future")

    def __init__(self, inputs: Inputs, rows: int, key):
        self.inputs, self.rows, self.key, self.future = inputs, rows, key, Future()


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
    def __init__(self, run: Run, max_batch_size: int, threads: int, max_enqueued: int, name: str = "batcher"):
        self._run = run
        self._max_rows = max_batch_size
        self._queue: queue.Queue[_Request | None] = queue.Queue(maxsize=max_enqueued * max_batch_size)
        self._pending: _Request | None = None
        self._take_lock = threading.Lock()
        self._active_lock = threading.Lock()
        self._active = 0  # requests inside submit()
        self._threads = [threading.Thread(target=self._loop, name=f"{name}-{i}", daemon=True) for i in range(threads)]
        for t in self._threads:
            t.start()

    def submit(self, inputs: Inputs) -> dict[str, np.ndarray]:
        rows, key = _rows_and_key(inputs)
        if rows is None or rows >= self._max_rows:
            return self._run(inputs)  # not batchable, or a batch already
        with self._active_lock:
            self._active += 1
            alone = self._active == 1
        try:
            if alone:  # nobody to batch with: run in the caller's thread, no hand-off latency
                return self._run(inputs)
            return self._enqueue(inputs, rows, key)
        finally:
            with self._active_lock:
                self._active -= 1

    def _enqueue(self, inputs: Inputs, rows: int, key) -> dict[str, np.ndarray]:
        request = _Request(inputs, rows, key)
        try:
            self._queue.put_nowait(request)
        except queue.Full:
            from serving.errors import ServingError
            import grpc

            raise ServingError(grpc.StatusCode.RESOURCE_EXHAUSTED, "the batching queue is full; retry later") from None
        return request.future.result()

    def close(self) -> None:
        for _ in self._threads:
            self._queue.put(None)

    def _take_batch(self) -> list[_Request] | None:
        with self._take_lock:
            first = self._pending or self._queue.get()
            self._pending = None
            if first is None:
                return None
            batch, rows = [first], first.rows
            while rows < self._max_rows:
                try:
                    nxt = self._queue.get_nowait()
                except queue.Empty:
                    break
                if nxt is None or nxt.key != first.key or rows + nxt.rows > self._max_rows:
                    self._pending = nxt  # starts the next batch
                    break
                batch.append(nxt)
                rows += nxt.rows
            return batch

    def _loop(self) -> None:
        while True:
            batch = self._take_batch()
            if batch is None:
                return
            if len(batch) == 1:
                self._finish(batch[0])
                continue
            try:
                merged = {name: np.concatenate([r.inputs[name] for r in batch]) for name in batch[0].inputs}
                outputs = self._run(merged)
                total = sum(r.rows for r in batch)
                if any(v.ndim == 0 or v.shape[0] != total for v in outputs.values()):
                    raise ValueError("an output is not batch-major")
            except Exception:
                # One bad request must not fail its neighbours: run them one by one.
                for r in batch:
                    self._finish(r)
                continue
            start = 0
            for r in batch:
                r.future.set_result({k: v[start:start + r.rows] for k, v in outputs.items()})
                start += r.rows

    def _finish(self, request: _Request) -> None:
        try:
            request.future.set_result(self._run(request.inputs))
        except BaseException as exc:  # delivered to the caller's thread
            request.future.set_exception(exc)
