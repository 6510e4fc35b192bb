"""The inline gRPC server (serving/grpc_transport.py) against grpcio's stock server: the same
answers, codes and details for the same handlers, through the stock client; its threads run calls
side by side, and stop() lets running calls finish within the grace and cancels them after."""
from __future__ import annotations

import threading
import time
from concurrent import futures

import grpc
import pytest

from serving import grpc_transport

SERVICE = "test.Echo"


def _parse(data: bytes) -> bytes:
    if data == b"unparsable":
        raise ValueError("not a request")
    return data


class Echo(grpc.GenericRpcHandler):
    """Unary methods whose behaviour the request names; `release` holds the `wait` method."""

    def __init__(self):
        self.release = threading.Event()
        self.entered = threading.Semaphore(0)

    def service(self, details):
        method = details.method.rsplit("/", 1)[-1]
        if details.method.rsplit("/", 1)[0] != f"/{SERVICE}":
            return None
        if method == "Lookup":
            raise RuntimeError("a bug in the lookup")
        if method == "Stream":
            return grpc.unary_stream_rpc_method_handler(lambda request, context: iter([request]))
        behaviour = getattr(self, method, None)
        return behaviour and grpc.unary_unary_rpc_method_handler(behaviour, request_deserializer=_parse)

    def echo(self, request, context):
        metadata = dict(context.invocation_metadata())
        context.set_trailing_metadata((("x-echo", metadata.get("x-id", "none")),))
        return request

    def abort(self, request, context):
        context.set_trailing_metadata((("x-echo", "aborted"),))
        context.abort(grpc.StatusCode.FAILED_PRECONDITION, f"refused {request.decode()}")

    def abort_ok(self, request, context):
        context.abort(grpc.StatusCode.OK, "not an error")

    def fail(self, request, context):
        raise KeyError("boom")

    def wait(self, request, context):
        self.entered.release()
        self.release.wait(10)
        return request

    def nap(self, request, context):
        time.sleep(0.05)
        return request


def _inline(workers: int):
    return grpc_transport.InlineServer(workers, [("grpc.so_reuseport", 0)])


def _stock(workers: int):
    return grpc.server(futures.ThreadPoolExecutor(max_workers=workers), options=[("grpc.so_reuseport", 0)])


class Running:
    def __init__(self, make, workers: int = 4):
        self.handler = Echo()
        self.server = make(workers)
        self.server.add_generic_rpc_handlers((self.handler,))
        self.port = self.server.add_insecure_port("127.0.0.1:0")
        self.server.start()
        self.channel = grpc.insecure_channel(f"127.0.0.1:{self.port}")

    def call(self, method: str, request: bytes = b"hi", **kwargs):
        return self.channel.unary_unary(f"/{SERVICE}/{method}")(request, timeout=10, **kwargs)

    def outcome(self, method: str, request: bytes = b"hi", service: str = SERVICE):
        """(code, details, trailing metadata, response) of one call."""
        try:
            response, call = self.channel.unary_unary(f"/{service}/{method}").with_call(
                request, timeout=10, metadata=(("x-id", "7"),))
            return grpc.StatusCode.OK, call.details(), dict(call.trailing_metadata()), response
        except grpc.RpcError as exc:
            return exc.code(), exc.details(), dict(exc.trailing_metadata() or ()), None

    def hold(self, pool: futures.ThreadPoolExecutor) -> futures.Future:
        """A `wait` call, once it is inside the handler (held there until handler.release)."""
        held = pool.submit(self.call, "wait", b"held")
        assert self.handler.entered.acquire(timeout=10)
        return held

    def close(self):
        self.handler.release.set()
        self.channel.close()
        self.server.stop(0).wait(10)


@pytest.fixture(scope="module")
def servers():
    inline, stock = Running(_inline), Running(_stock)
    yield inline, stock
    inline.close()
    stock.close()


@pytest.mark.parametrize("method,request_bytes,service", [
    ("echo", b"hello", SERVICE),
    ("abort", b"this", SERVICE),
    ("abort_ok", b"x", SERVICE),
    ("fail", b"x", SERVICE),
    ("missing", b"x", SERVICE),
    ("echo", b"x", "other.Service"),
    ("Lookup", b"x", SERVICE),
    ("Stream", b"x", SERVICE),
])
def test_answers_as_grpcio_does(servers, method, request_bytes, service):
    inline, stock = servers
    got, want = inline.outcome(method, request_bytes, service), stock.outcome(method, request_bytes, service)
    if method == "Stream":  # the stock server streams; the inline one serves unary methods only
        assert want[0] == grpc.StatusCode.OK and got[:2] == (grpc.StatusCode.UNIMPLEMENTED, "Method not found!")
        return
    assert got == want


def test_the_expected_answers(servers):
    inline, stock = servers
    assert inline.outcome("echo", b"hello") == (grpc.StatusCode.OK, "", {"x-echo": "7"}, b"hello")
    assert inline.outcome("abort", b"this")[:3] == (grpc.StatusCode.FAILED_PRECONDITION, "refused this",
                                                    {"x-echo": "aborted"})
    assert inline.outcome("fail")[:2] == (grpc.StatusCode.UNKNOWN, "Exception calling application: 'boom'")
    # Unparsable request bytes are the client's error: INVALID_ARGUMENT, where grpcio says INTERNAL.
    code, details = inline.outcome("echo", b"unparsable")[:2]
    assert code == grpc.StatusCode.INVALID_ARGUMENT and details.startswith("The request message cannot be parsed: ")
    assert stock.outcome("echo", b"unparsable")[:2] == (grpc.StatusCode.INTERNAL, "Exception deserializing request!")
    assert inline.outcome("missing")[:2] == (grpc.StatusCode.UNIMPLEMENTED, "Method not found!")
    assert inline.outcome("Lookup")[:2] == (grpc.StatusCode.UNKNOWN, "Error in service handler!")
    assert inline.outcome("echo", b"still served")[3] == b"still served"  # no thread was lost


def test_threads_run_calls_side_by_side():
    running = Running(_inline, workers=2)
    try:
        with futures.ThreadPoolExecutor(2) as pool:
            held = running.hold(pool)
            assert running.call("echo", b"meanwhile") == b"meanwhile"  # the other thread answers
            running.handler.release.set()
            assert held.result(10) == b"held"
    finally:
        running.close()


def test_one_call_at_a_time_is_answered_by_a_few_threads():
    running = Running(_inline, workers=32)
    try:
        assert [running.call("echo", bytes([i])) for i in range(50)] == [bytes([i]) for i in range(50)]
        # Two pollers; a third (rarely a fourth) when a call's last event and the next call's first
        # arrive together. Not the 32 that may run calls at once.
        assert len(running.server._threads) <= 4
    finally:
        running.close()


def test_threads_are_added_up_to_the_workers_and_parked_ones_reused():
    running = Running(_inline, workers=6)
    try:
        for burst in range(2):
            with futures.ThreadPoolExecutor(5) as pool:
                held = [running.hold(pool) for _ in range(5)]  # five in handlers: more than the two pollers
                assert running.call("echo", b"sixth") == b"sixth"  # and a sixth thread answers
                running.handler.release.set()
                assert [h.result(10) for h in held] == [b"held"] * 5
            running.handler.release.clear()
            assert len(running.server._threads) == 6  # the second burst woke the parked threads
    finally:
        running.close()


def test_one_worker_answers_in_turn():
    running = Running(_inline, workers=1)
    try:
        with futures.ThreadPoolExecutor(2) as pool:
            held = running.hold(pool)
            second = pool.submit(running.call, "echo", b"second")
            with pytest.raises(futures.TimeoutError):
                second.result(0.5)  # the only thread is busy
            running.handler.release.set()
            assert (held.result(10), second.result(10)) == (b"held", b"second")
    finally:
        running.close()



def test_calls_over_grpc_cores_pending_limits_are_refused():
    """Calls no thread has taken wait in gRPC core's queue of pending requests; over its limits
    (channel arguments; 1000 and 3000 by default) core refuses them, and the client sees CANCELLED."""
    limits = [("grpc.so_reuseport", 0), ("grpc.server.max_pending_requests", 2),
              ("grpc.server.max_pending_requests_hard_limit", 2)]
    running = Running(lambda workers: grpc_transport.InlineServer(workers, limits), workers=1)
    try:
        with futures.ThreadPoolExecutor(9) as pool:
            held = running.hold(pool)  # the only thread is busy: every other call waits, or is refused
            others = [pool.submit(running.outcome, "echo", b"x") for _ in range(8)]
            refused, waiting = futures.wait(others, timeout=10, return_when=futures.FIRST_COMPLETED)
            assert refused and waiting
            assert {f.result()[0] for f in refused} == {grpc.StatusCode.CANCELLED}
            running.handler.release.set()
            assert held.result(10) == b"held"
            codes = [f.result(10)[0] for f in others]
        assert set(codes) == {grpc.StatusCode.OK, grpc.StatusCode.CANCELLED}
        assert codes.count(grpc.StatusCode.OK) >= 2  # those pending within the limit were answered
        assert running.call("echo", b"after") == b"after"
    finally:
        running.close()


def test_many_clients_mixing_answers_errors_and_deadlines_leave_nothing_behind():
    """16 clients on 8 threads, each call one of: an answer, a handler's error, an abort, an unknown
    method, a deadline that passes in the handler, a cancel. Each gets its own outcome; after them
    no call counts as running, and stop() ends at once with every thread."""
    running = Running(_inline, workers=8)
    expected = {"echo": grpc.StatusCode.OK, "fail": grpc.StatusCode.UNKNOWN,
                "abort": grpc.StatusCode.FAILED_PRECONDITION, "missing": grpc.StatusCode.UNIMPLEMENTED,
                "nap": grpc.StatusCode.DEADLINE_EXCEEDED, "cancel": grpc.StatusCode.CANCELLED}
    kinds = list(expected)

    def client(index: int) -> list[tuple]:
        outcomes = []
        for n in range(60):
            kind, request = kinds[(index + n) % len(kinds)], f"{index}-{n}".encode()
            method = running.channel.unary_unary(f"/{SERVICE}/{'nap' if kind == 'cancel' else kind}")
            try:
                if kind == "cancel":
                    call = method.future(request, timeout=10)
                    call.cancel()
                    call.result()
                outcome = (grpc.StatusCode.OK, method(request, timeout=0.01 if kind == "nap" else 10))
            except grpc.FutureCancelledError:
                outcome = (grpc.StatusCode.CANCELLED, None)
            except grpc.RpcError as exc:
                outcome = (exc.code(), None)
            outcomes.append((kind, request, *outcome))
        return outcomes

    try:
        with futures.ThreadPoolExecutor(16) as pool:
            results = [o for r in pool.map(client, range(16)) for o in r]
        for kind, request, code, response in results:
            assert code == expected[kind], (kind, request, code)
            assert response == (request if kind == "echo" else None)
        deadline = time.monotonic() + 5
        while running.server._calls and time.monotonic() < deadline:  # the last batches complete
            time.sleep(0.01)
        assert running.server._calls == 0
        assert running.call("echo", b"still") == b"still"
        started = time.monotonic()
        # Nothing left to wait for: stop() ends well before its grace (a wide margin, for a loaded machine).
        assert running.server.stop(30).wait(30)
        assert time.monotonic() - started < 10
        for thread in running.server._threads:
            thread.join(5)
            assert not thread.is_alive()
    finally:
        running.handler.release.set()
        running.channel.close()

def _stop_while_a_call_runs(make, grace: float):
    """Stops a server while a call is inside its handler: (the call's future, the stopped event)."""
    running = Running(make, workers=2)
    pool = futures.ThreadPoolExecutor(1)
    held = running.hold(pool)
    pool.shutdown(wait=False)
    return running, held, running.server.stop(grace)


@pytest.mark.parametrize("make", [_inline, _stock], ids=["inline", "stock"])
def test_stop_finishes_running_calls_within_the_grace(make):
    running, held, stopped = _stop_while_a_call_runs(make, grace=10)
    with pytest.raises(grpc.RpcError) as refused:
        running.call("echo", b"late")
    # Refused: UNAVAILABLE, or CANCELLED when the call reached gRPC core's pending calls before the
    # shutdown refused new streams (core's behaviour, grpc/grpc#41785; seen on the stock server).
    assert refused.value.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED)
    assert not stopped.is_set()
    running.handler.release.set()
    assert held.result(10) == b"held"
    assert stopped.wait(10)
    running.channel.close()
    for thread in getattr(running.server, "_threads", ()):
        thread.join(5)
        assert not thread.is_alive()


@pytest.mark.parametrize("make", [_inline, _stock], ids=["inline", "stock"])
def test_stop_cancels_running_calls_after_the_grace(make):
    running, held, stopped = _stop_while_a_call_runs(make, grace=0.2)
    with pytest.raises(grpc.RpcError) as cancelled:
        held.result(10)
    assert (cancelled.value.code(), cancelled.value.details()) == (grpc.StatusCode.UNAVAILABLE, "Cancelling all calls")
    running.handler.release.set()
    assert stopped.wait(10)
    running.channel.close()


def test_without_grpcio_core_the_stock_server_serves(monkeypatch):
    monkeypatch.setattr(grpc_transport, "cygrpc", None)
    running = Running(lambda workers: grpc_transport.make_server(workers, [("grpc.so_reuseport", 0)]))
    try:
        assert not isinstance(running.server, grpc_transport.InlineServer)
        assert running.outcome("echo", b"hello") == (grpc.StatusCode.OK, "", {"x-echo": "7"}, b"hello")
    finally:
        running.close()


def test_make_server_is_inline_here():
    assert isinstance(grpc_transport.make_server(2, []), grpc_transport.InlineServer)
