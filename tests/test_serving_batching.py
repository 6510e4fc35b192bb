"""Server-side batching: requests queued behind a running batch run together as one call, each gets
its own rows back, a bad request fails alone, and a full queue answers RESOURCE_EXHAUSTED."""
import threading
import time

import grpc
import numpy as np
import pytest

from serving.batching import Batcher
from serving.errors import ServingError


class Model:
    """Doubles its input; the first call blocks until released, so later requests queue behind it."""

    def __init__(self):
        self.batches: list[int] = []
        self.release = threading.Event()
        self.entered = threading.Event()
        self.lock = threading.Lock()

    def __call__(self, inputs):
        x = inputs["x"]
        with self.lock:
            first = not self.batches
            self.batches.append(x.shape[0])
        if first:
            self.entered.set()
            assert self.release.wait(10)
        if (x < 0).any():
            raise ServingError(grpc.StatusCode.INVALID_ARGUMENT, f"negative input {x.min()}")
        return {"y": x * 2}


def _submit_all(batcher, values, results, errors):
    """One thread per value, each submitting it and filling `results` or `errors` under it."""
    def one(v):
        try:
            results[v] = batcher.submit({"x": np.array([[v]], np.float32)})["y"]
        except ServingError as exc:
            errors[v] = exc

    return [threading.Thread(target=one, args=(v,)) for v in values]


def _wait_queued(batcher, n):
    deadline = time.monotonic() + 10
    while len(batcher._waiting) < n:
        assert time.monotonic() < deadline, "requests did not queue"
        time.sleep(0.01)


def _queue_behind_a_running_request(model, batcher, values):
    """Starts one request (100.0) that holds the model, then `values` as requests that must queue
    behind it. Returns every thread and all requests' results and errors (keyed by value)."""
    results, errors = {}, {}
    first = _submit_all(batcher, [100.0], results, errors)
    first[0].start()
    assert model.entered.wait(10)
    queued = _submit_all(batcher, values, results, errors)
    for t in queued:
        t.start()
    _wait_queued(batcher, len(values))
    return first + queued, results, errors


def _release(model, threads):
    model.release.set()
    for t in threads:
        t.join(10)


def test_queued_requests_run_as_one_batch_and_get_their_own_rows():
    model = Model()
    batcher = Batcher(model, max_batch_size=32, threads=1, max_enqueued=10)
    threads, results, errors = _queue_behind_a_running_request(model, batcher, [float(v) for v in range(1, 9)])
    _release(model, threads)
    assert model.batches == [1, 8]  # the lone first request, then all eight queued ones together
    assert not errors
    assert results[100.0].tolist() == [[200.0]]
    for v in range(1, 9):
        assert results[float(v)].tolist() == [[2.0 * v]]


def test_a_bad_request_fails_alone():
    model = Model()
    batcher = Batcher(model, max_batch_size=32, threads=1, max_enqueued=10)
    threads, results, errors = _queue_behind_a_running_request(model, batcher, [1.0, -5.0, 3.0])
    _release(model, threads)
    assert model.batches[:2] == [1, 3] and sorted(model.batches[2:]) == [1, 1, 1]  # merged, then one by one
    assert set(errors) == {-5.0} and "negative input -5" in errors[-5.0].message
    assert results[1.0].tolist() == [[2.0]] and results[3.0].tolist() == [[6.0]]


def test_full_queue_is_resource_exhausted():
    model = Model()
    batcher = Batcher(model, max_batch_size=2, threads=1, max_enqueued=1)  # room for 2 queued requests
    threads, results, _ = _queue_behind_a_running_request(model, batcher, [1.0, 2.0])
    with pytest.raises(ServingError) as info:
        batcher.submit({"x": np.array([[3.0]], np.float32)})
    assert info.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED
    _release(model, threads)
    assert results[1.0].tolist() == [[2.0]] and results[2.0].tolist() == [[4.0]]
