"""A gRPC server on grpcio's core whose polling threads run the calls themselves.

`grpc.server` polls its completion queue in one thread and hands every call to a thread pool, then
back for each step (the request message, the status): on a server pinned to one core that costs
about 100 us of CPU per call in thread switches, condition variables and GIL hand-offs, as much as
a whole no-model PredictionService answer. Here threads poll one completion queue, as gRPC C++'s
synchronous server does (one or two at a time; more are started as calls overlap, up to `workers`),
and the thread that takes a call's message runs its handler and sends the answer with the status in
one batch.

What is served is what loopline serves: unary-unary methods (all of TF Serving's), from generic
handlers (the generated `add_*_to_server` functions register those). The answers follow grpcio's
own server: an unknown method is UNIMPLEMENTED "Method not found!", a handler lookup that raises
UNKNOWN "Error in service handler!", a handler's exception UNKNOWN "Exception calling
application: ...", `context.abort` the code and details given. One answer is not grpcio's: a
request message that cannot be parsed is the client's error, INVALID_ARGUMENT (grpcio and gRPC
C++ say INTERNAL). grpcio's core module is not
public API: where it is not there, `make_server` returns the stock server. Calls beyond those
running wait in gRPC core's queue of pending requests; over its limits (1000 and 3000 by default)
core refuses them and the client sees CANCELLED.
"""
from __future__ import annotations

import logging
import threading
import time
from typing import Iterable, Sequence

import grpc

try:
    from grpc._cython import cygrpc
except ImportError:  # a grpcio without its core module under that name: the stock server is used
    cygrpc = None

log = logging.getLogger("loopline.serving")

_NEW_CALL = object()  # completion queue tags
_FINISHED = object()
_SHUTDOWN = object()
_POLL_SECONDS = 1.0
MIN_POLLERS, MAX_POLLERS = 1, 2  # gRPC C++'s defaults for its synchronous server


class _Aborted(Exception):
    """Raised by context.abort to leave the handler (grpcio raises a bare Exception)."""


class _Context:
    """What a unary handler gets of grpc.ServicerContext here."""

    __slots__ = ("_event", "trailing", "code", "details")

    def __init__(self, event):
        self._event = event
        self.trailing = None
        self.code, self.details = grpc.StatusCode.OK, ""

    def invocation_metadata(self):
        return self._event.invocation_metadata

    def set_trailing_metadata(self, trailing_metadata) -> None:
        self.trailing = tuple(trailing_metadata)

    def abort(self, code: grpc.StatusCode, details: str) -> None:
        if code == grpc.StatusCode.OK:  # as grpcio: OK cannot fail a call
            code, details = grpc.StatusCode.UNKNOWN, ""
        self.code, self.details = code, details
        raise _Aborted()


class _HandlerCallDetails(grpc.HandlerCallDetails):
    def __init__(self, method: str, invocation_metadata):
        self.method, self.invocation_metadata = method, invocation_metadata


class InlineServer:
    """The subset of grpc.Server that loopline uses: generic handlers, ports, start, stop."""

    def __init__(self, workers: int, options: Sequence[tuple[str, object]]):
        self._workers = workers
        self._queue = cygrpc.CompletionQueue()
        self._server = cygrpc.Server(tuple(options), False)
        self._server.register_completion_queue(self._queue)
        self._generic: list[grpc.GenericRpcHandler] = []
        self._handlers: dict[bytes, grpc.RpcMethodHandler | None] = {}  # by method, as found
        self._lock = threading.Lock()
        self._serving = self._shut_down = False
        self._calls = 0  # accepted and not yet finished
        self._stopped = threading.Event()
        self._threads: list[threading.Thread] = []
        self._polling = 0  # threads in (or on their way to) the queue's poll
        self._parked: list[threading.Lock] = []  # idle threads, each waiting on its held lock; last in, first out

    def add_generic_rpc_handlers(self, handlers: Iterable[grpc.GenericRpcHandler]) -> None:
        self._generic.extend(handlers)

    def add_insecure_port(self, address: str) -> int:
        return self._bound(address, self._server.add_http2_port(address.encode()))

    def add_secure_port(self, address: str, credentials: grpc.ServerCredentials) -> int:
        return self._bound(address, self._server.add_http2_port(address.encode(), credentials._credentials))

    @staticmethod
    def _bound(address: str, port: int) -> int:
        if port == 0:  # as grpcio: core says no more than that
            raise RuntimeError(f"Failed to bind to address {address}; set GRPC_VERBOSITY=debug env to see detailed error")
        return port

    def start(self) -> None:
        with self._lock:
            self._server.start()
            self._serving = True
            self._server.request_call(self._queue, self._queue, _NEW_CALL)
            for _ in range(min(MAX_POLLERS, self._workers)):
                self._add_poller()

    def stop(self, grace: float | None) -> threading.Event:
        """Takes no new calls; cancels those still running after `grace` seconds (None: at once).
        The event is set once every call has ended and the queue is closed."""
        with self._lock:
            if not self._serving:
                if not self._shut_down and not self._threads:
                    self._stopped.set()  # never started
                return self._stopped
            self._serving = False
            self._server.shutdown(self._queue, _SHUTDOWN)
            if grace is None:
                self._server.cancel_all_calls()
        if grace is not None:
            threading.Thread(target=self._cancel_after, args=(grace,), daemon=True).start()
        return self._stopped

    def wait_for_termination(self, timeout: float | None = None) -> bool:
        return self._stopped.wait(timeout)

    def _cancel_after(self, grace: float) -> None:
        if not self._stopped.wait(grace):
            with self._lock:  # the lock keeps destroy() from running under it
                if not self._stopped.is_set():
                    self._server.cancel_all_calls()

    # -- the polling threads -------------------------------------------------------------------
    # As gRPC C++'s synchronous server: between MIN_POLLERS and MAX_POLLERS threads poll; a thread
    # that takes an event leaves the pollers, adding one when fewer than MIN_POLLERS are left, and
    # after the event polls again or, MAX_POLLERS being there, parks. A parked thread is woken
    # before a new one is started, the last parked first: at one call at a time the same two
    # threads, their caches warm, answer every call (32 threads taking turns cost ~0.03 ms a call).
    def _add_poller(self) -> None:
        """With the lock held: a parked thread, else a new one while fewer than `workers` run."""
        if self._parked:
            self._parked.pop().release()
        elif len(self._threads) < self._workers:
            thread = threading.Thread(target=self._poll, name=f"grpc_{len(self._threads)}", daemon=True)
            self._threads.append(thread)
            thread.start()
        else:
            return  # every thread is busy: calls wait in gRPC's queue
        self._polling += 1

    def _poll(self) -> None:
        while True:
            event = self._queue.poll(time.time() + _POLL_SECONDS)
            kind = event.completion_type
            if kind == cygrpc.CompletionType.queue_timeout:
                continue
            if kind == cygrpc.CompletionType.queue_shutdown:
                return
            with self._lock:
                self._polling -= 1
                if self._polling < MIN_POLLERS:
                    self._add_poller()
            self._handle(event)
            with self._lock:
                if self._polling < MAX_POLLERS or self._stopped.is_set():
                    self._polling += 1
                    continue
                park = threading.Lock()
                park.acquire()
                self._parked.append(park)
            park.acquire()  # released by _add_poller (which counts this thread in) or at the end

    def _handle(self, event) -> None:
        tag = event.tag
        try:
            if tag is _NEW_CALL:
                self._new_call(event)
            elif tag is _FINISHED:
                self._ended()
            elif tag is _SHUTDOWN:
                self._ended(shutdown=True)
            else:
                tag(event)  # a call's request message arrived
        except Exception:  # noqa: BLE001 - a bug must cost one call, not a polling thread
            log.exception("gRPC: a call could not be handled")

    def _ended(self, shutdown: bool = False) -> None:
        """A call's last batch completed, or the shutdown did. Once both the shutdown and every call
        have, the queue is closed: a batch started on a closed queue aborts the process."""
        with self._lock:
            if shutdown:
                self._shut_down = True
            else:
                self._calls -= 1
            if self._shut_down and self._calls == 0 and not self._stopped.is_set():
                self._server.destroy()
                self._queue.shutdown()  # every thread's next poll ends it
                self._stopped.set()
                while self._parked:  # parked threads poll once more, and end
                    self._parked.pop().release()

    def _new_call(self, event) -> None:
        with self._lock:
            if self._serving:  # stopping: the call taken is answered, no other is asked for
                self._server.request_call(self._queue, self._queue, _NEW_CALL)
            if not event.success:
                return  # the request the shutdown ended
            self._calls += 1
        try:
            handler = self._handler(event.call_details.method, event.invocation_metadata)
        except Exception as exc:  # noqa: BLE001 - as grpcio
            log.exception("Exception servicing handler: %s", exc)
            self._finish(event.call, None, grpc.StatusCode.UNKNOWN, "Error in service handler!")
            return
        if handler is None:
            self._finish(event.call, None, grpc.StatusCode.UNIMPLEMENTED, "Method not found!")
            return
        try:
            event.call.start_server_batch((cygrpc.ReceiveMessageOperation(0),),
                                          lambda message_event: self._run(event, handler, message_event))
        except Exception:
            self._ended()
            raise

    def _handler(self, method: bytes, metadata) -> grpc.RpcMethodHandler | None:
        if method in self._handlers:
            return self._handlers[method]
        details = _HandlerCallDetails(method.decode(), metadata)
        found = next((h for h in (g.service(details) for g in self._generic) if h is not None), None)
        if found is not None and (found.request_streaming or found.response_streaming):
            log.error("%s: streaming methods are not served", details.method)
            found = None
        self._handlers[method] = found
        return found

    def _run(self, call_event, handler: grpc.RpcMethodHandler, message_event) -> None:
        """Runs a unary call whose request message arrived, and answers it."""
        call = call_event.call
        message = message_event.batch_operations[0].message() if message_event.success else None
        if message is None:  # cancelled, or closed without a message
            self._finish(call, None, grpc.StatusCode.UNIMPLEMENTED,
                         f'"{call_event.call_details.method.decode()}" requires exactly one request message.')
            return
        try:
            request = handler.request_deserializer(message) if handler.request_deserializer else message
        except Exception as exc:  # noqa: BLE001 - the client's bytes: its error, not the server's
            self._finish(call, None, grpc.StatusCode.INVALID_ARGUMENT, f"The request message cannot be parsed: {exc}")
            return
        context, payload = _Context(call_event), None
        try:
            response = handler.unary_unary(request, context)
        except _Aborted:
            code, details = context.code, context.details
        except Exception as exc:  # noqa: BLE001 - as grpcio: the client gets UNKNOWN, the log the trace
            log.exception("Exception calling application: %s", exc)
            code, details = grpc.StatusCode.UNKNOWN, f"Exception calling application: {exc}"
        else:
            try:
                payload = handler.response_serializer(response) if handler.response_serializer else response
                code, details = grpc.StatusCode.OK, ""
            except Exception:  # noqa: BLE001
                log.exception("Failed to serialize response!")
                code, details = grpc.StatusCode.INTERNAL, "Failed to serialize response!"
        self._finish(call, payload, code, details, context.trailing)

    def _finish(self, call, payload: bytes | None, code: grpc.StatusCode, details: str, trailing=None) -> None:
        """Initial metadata, the response (if any) and the status in one batch."""
        operations = [cygrpc.SendInitialMetadataOperation(None, 0)]
        if payload is not None:
            operations.append(cygrpc.SendMessageOperation(payload, 0))
        operations += [cygrpc.SendStatusFromServerOperation(trailing, code.value[0], details.encode(), 0),
                       cygrpc.ReceiveCloseOnServerOperation(0)]
        try:
            call.start_server_batch(operations, _FINISHED)
        except Exception:
            self._ended()
            raise


def make_server(workers: int, options: Sequence[tuple[str, object]]):
    """An InlineServer, or grpcio's stock server (a pool of `workers` threads) where grpcio's core
    module is not usable."""
    if cygrpc is not None:
        try:
            return InlineServer(workers, options)
        except Exception as exc:  # noqa: BLE001 - a changed private API: serve anyway
            log.warning("gRPC: the inline server cannot start (%s); using grpcio's thread-pool server", exc)
    from concurrent import futures

    return grpc.server(futures.ThreadPoolExecutor(max_workers=workers, thread_name_prefix="grpc"), options=options,
                       maximum_concurrent_rpcs=workers * 32)
